"""How much memory a computation may use: a budget given in bytes or as text ("2GiB"), or
by default half the memory available on the device now."""

import os
import re
from pathlib import Path
from typing import Any

import torch

UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}  # fmt: skip

# The budget where the free memory cannot be read (a device that does not say).
FALLBACK = 2 * 2**30


def free_memory(device: torch.device) -> int | None:
    """The bytes available on `device` now: free GPU memory, or the kernel's estimate of
    the memory a new process can use without swapping (`MemAvailable`, which counts the
    page cache that can be dropped), else the free pages; None where none can be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def memory_budget(budget: Any, device: torch.device) -> int:
    """`budget` in bytes: a positive int, a text such as `"512MiB"` or `"2 GB"` (units
    `UNITS`), or None for half of what `free_memory` reads (`FALLBACK` where it reads
    nothing)."""
    if budget is None:
        free = free_memory(device)
        return FALLBACK if free is None else max(1, free // 2)
    if isinstance(budget, int) and not isinstance(budget, bool) and budget > 0:
        return budget
    if isinstance(budget, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", budget)
        if match and (match.group(2) or "B") in UNITS:
            value = int(float(match.group(1)) * UNITS[match.group(2) or "B"])
            if value > 0:
                return value
    raise ValueError(
        f"memory_budget must be a positive number of bytes, a text such as '2GiB' (units "
        f"{', '.join(UNITS)}) or None (half the available memory), got {budget!r}"
    )
