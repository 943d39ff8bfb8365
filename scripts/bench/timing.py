"""Timing for `scripts/bench`: interleaved rounds, per-round ratios, the clock, malloc.

Contenders run interleaved in the same rounds (A B C, then C B A, ...), so that a slow spell
on a shared machine hits them all; each round gives one ratio per contender against the
group's reference (and, optionally, against a second reference in the same group).
"""

import ctypes
import dataclasses
import gc
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

# "wall": elapsed time. "cpu": CPU time of this process, which on a machine shared with other
# jobs leaves out the time spent waiting for a core (meaningful with --threads 1).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}

# glibc's malloc serves blocks above an adaptive threshold (128 kB at first) with fresh
# mmap'd pages and trims the heap when its top is free. Which activations land where then
# varies from one process to the next, and with it the page faults a forward pays: on a
# 2 ms forward, 0 to 400 faults and 0 to 0.7 ms of system time per call, for the bare
# models as much as for the toolkits. Fixed thresholds keep freed activations for reuse.
STEADY_MALLOC = {"M_MMAP_THRESHOLD": 64 << 20, "M_TRIM_THRESHOLD": 256 << 20}
_MALLOPT = {"M_TRIM_THRESHOLD": -1, "M_MMAP_THRESHOLD": -3}


def steady_malloc() -> bool:
    """Fix glibc malloc's thresholds (`STEADY_MALLOC`); False where there is no glibc."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    return all(libc.mallopt(_MALLOPT[k], v) == 1 for k, v in STEADY_MALLOC.items())


@dataclasses.dataclass
class Contender:
    """One thing to time: `fn()` runs it once."""

    name: str
    fn: Callable[[], Any]


def _sample(fn: Callable[[], Any], inner: int, clock: Callable[[], float]) -> float:
    gc.collect()  # cheap: `interleave` froze the objects that existed before timing
    gc.disable()
    try:
        start = clock()
        for _ in range(inner):
            fn()
        return (clock() - start) / inner
    finally:
        gc.enable()


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def interleave(
    contenders: list[Contender],
    rounds: int,
    min_sample_s: float,
    clock: Callable[[], float],
    second_reference: str | None = None,
) -> dict:
    """Time contenders in alternating order (A B C, C B A, ...); the first is the reference.

    Returns, per contender, its per-call times, its per-round ratio to the reference and,
    when `second_reference` names a contender, its per-round ratio to that one too.
    """
    gc.collect()
    gc.freeze()  # the models and imported libraries: millions of objects no sample creates
    try:
        inner = {}
        for c in contenders:
            c.fn()  # warm-up: first-call allocations, lazy inits
            once = min(_sample(c.fn, 1, clock) for _ in range(3))
            inner[c.name] = max(1, math.ceil(min_sample_s / max(once, 1e-9)))
        times: dict[str, list[float]] = {c.name: [] for c in contenders}
        for r in range(rounds):
            for c in contenders if r % 2 == 0 else reversed(contenders):
                times[c.name].append(_sample(c.fn, inner[c.name], clock))
    finally:
        gc.unfreeze()

    def ratios(name: str, ref: str) -> list[float]:
        return [t / t_ref for t, t_ref in zip(times[name], times[ref], strict=True)]

    out = {}
    for c in contenders:
        out[c.name] = {
            "median_s": statistics.median(times[c.name]),
            "min_s": min(times[c.name]),
            "max_s": max(times[c.name]),
            "ratio": _summary(ratios(c.name, contenders[0].name)),
            "inner": inner[c.name],
            "rounds": rounds,
        }
        if second_reference is not None:
            out[c.name]["ratio_same_math"] = _summary(ratios(c.name, second_reference))
    return out
