"""Memory measures of `scripts/bench`: cache sizes and peak resident memory.

Each mode runs once in a fresh process (`scripts/bench --memory-probe`), so that memory the
allocator kept from earlier runs cannot hide a peak; with `--malloc steady` (the default)
that process fixes glibc's thresholds as the timed runs do (`timing.STEADY_MALLOC`).
"""

import dataclasses
import gc
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from reference import BareTransformer, build, transformer_lens_model
from settings import BRIDGE, NATIVE
from timing import steady_malloc
from tl4 import bridge_models, transformer_lens_major
from torch import Tensor

OURS, TL = "hookedattn", "transformer_lens"
BENCH = Path(__file__).resolve().parent  # run as a folder: its __main__.py


def cache_stats(items: list[tuple[str, Tensor]]) -> dict:
    """Names, bytes summed over names, and bytes counting each storage once."""
    storages: dict[int, int] = {}
    for _, t in items:
        storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return {
        "names": len(items),
        "bytes_summed_over_names": sum(t.numel() * t.element_size() for _, t in items),
        "distinct_storages": len(storages),
        "bytes_distinct_storages": sum(storages.values()),
    }


def status_bytes(field: str) -> int | None:
    """A field of `/proc/self/status` (`VmHWM`, `VmRSS`) in bytes; None where it cannot be read."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def reset_peak_rss() -> bool:
    """Reset this process's `VmHWM` to its current resident size; False where it cannot."""
    try:  # Linux: writing 5 to clear_refs resets VmHWM to the current resident size
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


SAME_NAMES = "hookedattn run_with_cache, TransformerLens's names"
MEMORY_MODES = (
    "plain forward (bare reference)",
    "hookedattn forward",
    "hookedattn run_with_cache, everything",
    SAME_NAMES,
    "transformer_lens forward",
    "transformer_lens run_with_cache, everything",
    *(f"{column} run_with_cache, everything" for column in (BRIDGE, NATIVE)),
)
# TransformerLens 4's full caches (`TransformerBridge`, `tl4.py`): its modes replace
# TransformerLens 3's where version 4 is installed.
TL4_MODES = MEMORY_MODES[-2:]
# The names a full cache of ours holds and TransformerLens's does not: each norm's output
# (TL has no `hook_out` on its norms; its `unembed.hook_in` is the final norm's output).
_OURS_ONLY = ("ln1.hook_out", "ln2.hook_out", "ln_final.hook_out")


def _tl_names(name: str) -> bool:
    return not name.endswith(_OURS_ONLY)


def memory_probe(spec: dict) -> dict:
    """Run one mode once in this (fresh) process and report its peak resident memory."""
    setting, mode = spec["setting"], spec["mode"]
    if spec.get("steady_malloc"):
        steady_malloc()
    model, tokens = build(setting["cfg"], setting["batch"], setting["pos"])
    if mode in TL4_MODES:
        column = mode.removesuffix(" run_with_cache, everything")
        bridge = bridge_models(model, (column,)).get(column)
        if bridge is None:
            return {"mode": mode, "error": "transformer_lens 4 is not installed"}
        return _cpu_or_cuda_probe(model, mode, bridge.run_with_cache, tokens)
    subject = transformer_lens_model(model) if mode.startswith(TL) else model
    if subject is None:
        return {"mode": mode, "error": "transformer_lens is not installed"}
    bare = BareTransformer(model)
    fn = {
        "plain forward (bare reference)": bare,
        f"{OURS} forward": subject,
        f"{OURS} run_with_cache, everything": subject.run_with_cache,
        SAME_NAMES: lambda tokens: subject.run_with_cache(tokens, names_filter=_tl_names),
        f"{TL} forward": subject,
        f"{TL} run_with_cache, everything": subject.run_with_cache,
    }[mode]
    return _cpu_or_cuda_probe(model, mode, fn, tokens)


def _cpu_or_cuda_probe(model: Any, mode: str, fn: Any, tokens: Tensor) -> dict:
    """The peak of `fn(tokens)` over what the process held before: resident memory and
    live tensor bytes on a CPU, allocated memory on an accelerator."""
    if model.cfg.device.startswith("cuda"):
        return _cuda_probe(mode, fn, tokens)
    with torch.no_grad():
        fn(tokens[:1, :2])  # first-call allocations happen here, not in the measurement
        gc.collect()
        baseline = status_bytes("VmRSS")
        if not reset_peak_rss() or baseline is None:
            return {"mode": mode, "error": "peak resident memory cannot be reset here"}
        out = fn(tokens)
        peak = status_bytes("VmHWM")
    result = {"mode": mode, "peak_extra_bytes": peak - baseline, "baseline_bytes": baseline}
    if isinstance(out, tuple):
        cache = out[1]
        result["cache"] = cache_stats(list(cache.items()))
    del out
    result["peak_live_bytes"] = live_tensor_peak(fn, tokens)
    return result


LIVE = " (live tensors)"  # a memory target's measure with this suffix reads the live peak


def live_tensor_peak(fn: Any, tokens: Tensor) -> int:
    """The peak of the bytes held by tensors made during `fn(tokens)` (torch's own
    accounting of its allocations and frees, from the profiler's memory events): what
    `torch.cuda.max_memory_allocated` reports on a GPU. Resident memory also holds what
    the C allocator keeps of freed blocks, which depends on the order of allocations."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        out = fn(tokens)
    changes = sorted(
        (event.start_ns(), event.nbytes())
        for event in prof.profiler.kineto_results.events()
        if event.name() == "[memory]"
    )
    live = peak = 0
    for _, nbytes in changes:
        live += nbytes
        peak = max(peak, live)
    del out
    return peak


def _probe(setting: Any, mode: str, steady: bool) -> dict:
    """`mode`'s peak, measured by `scripts/bench --memory-probe` in a fresh process (`steady`:
    with glibc's thresholds fixed)."""
    spec = {"setting": dataclasses.asdict(setting), "mode": mode, "steady_malloc": steady}
    spec = json.dumps(spec)
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--memory-probe", spec],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"memory probe {mode} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _cuda_probe(mode: str, fn: Any, tokens: Tensor) -> dict:
    """The peak of the accelerator's allocated memory above what it held before the run."""
    with torch.no_grad():
        fn(tokens[:1, :2])
        torch.cuda.synchronize()
        baseline = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        out = fn(tokens)
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
    result = {"mode": mode, "peak_extra_bytes": peak - baseline, "baseline_bytes": baseline}
    if isinstance(out, tuple):
        result["cache"] = cache_stats(list(out[1].items()))
    return result


def memory_section(run: Any, key: str, setting: Any, repeats: int | None = None) -> None:
    """Each mode's peak in `repeats` fresh processes (3; 1 with `--quick`): the median, and
    the min-max. A resident-memory peak moves by several MB from one process to the next
    (which pages the allocator reuses), so one process is not a measurement."""
    print(f"memory [{key}] {setting.description}")
    repeats = repeats or (1 if run.quick else 3)
    # At long context only the forwards: a full cache holds every layer's pattern by design.
    modes = MEMORY_MODES[:2] if key == "long" else MEMORY_MODES
    major = transformer_lens_major()
    for mode in modes:
        if mode.startswith(TL) and (
            not run.use_tl or major is None or (mode in TL4_MODES) != (major >= 4)
        ):
            continue  # the installed TransformerLens's modes only
        if mode == SAME_NAMES and not run.use_tl:
            continue
        results = [_probe(setting, mode, run.steady_malloc) for _ in range(repeats)]
        if "error" in results[0]:
            run.skip("memory", mode, results[0]["error"])
            continue
        peaks = sorted(r["peak_extra_bytes"] for r in results)
        result = results[0] | {
            "peak_extra_bytes": peaks[len(peaks) // 2],
            "peak_extra_bytes_range": [peaks[0], peaks[-1]],
            "processes": repeats,
        }
        if "peak_live_bytes" in results[0]:
            live = sorted(r["peak_live_bytes"] for r in results)
            result["peak_live_bytes"] = live[len(live) // 2]
        run.memory.append({"setting": key} | result)
        cache = result.get("cache")
        detail = (
            f"; cache {cache['bytes_distinct_storages'] / 2**20:.1f} MB in "
            f"{cache['distinct_storages']} storages for {cache['names']} names "
            f"({cache['bytes_summed_over_names'] / 2**20:.1f} MB summed over names)"
            if cache
            else ""
        )
        live = result.get("peak_live_bytes")
        detail = (f"; live tensors {live / 2**20:.1f} MB" if live is not None else "") + detail
        print(f"  {mode:<44} peak +{result['peak_extra_bytes'] / 2**20:8.1f} MB{detail}")
