"""How much memory a device has free: what a default memory budget, or a refusal before an
allocation that cannot succeed, is measured against."""

import os

import torch


def free_memory(device: str | torch.device) -> int | None:
    """Bytes free on `device` now: a GPU's free memory, or the machine's available memory
    for the CPU (`sysconf`'s available pages); None where the system does not say."""
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    if device.type != "cpu":
        return None
    pages = _sysconf("SC_AVPHYS_PAGES") or _sysconf("SC_PHYS_PAGES")
    return pages * (_sysconf("SC_PAGE_SIZE") or 4096) if pages else None


def _sysconf(name: str) -> int:
    try:
        return max(0, os.sysconf(name))
    except (ValueError, OSError, AttributeError):
        return 0
