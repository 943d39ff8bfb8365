"""The distributed section of `scripts/bench`: two tensor-parallel ranks against one process.

    python scripts/bench/distributed.py             # settings a and b (minutes on 2 cores)
    python scripts/bench/distributed.py --quick     # a tiny setting: a smoke run
    python scripts/bench --sections distributed     # the same, inside the benchmark report

One `torchrun --nproc_per_node 2` job (gloo on CPUs, NCCL on GPUs): each rank loads the
model split (`HookedTransformer.load(path, tp_size=2)`, reading its slices), then the whole
model too (the one-process reference, in the same process), and times both interleaved in
the same rounds: the forward, `run_with_cache` of everything, of one name, and of
everything as local activations (no gathers). Both ranks run the reference at once, each
on its own core with one thread, so a ratio is "two cores split one model" against "one
core runs it whole". Each rank also reports its weight bytes, the growth of its resident
set's high-water mark while loading its share (against a one-process load in a fresh
process), and the communication of one forward: every collective's tensor bytes, counted.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
SELF = Path(__file__).resolve()
sys.path.insert(0, str(ROOT))


def _high_water_mark() -> int:
    # This process's own peak; ru_maxrss would carry the parent's over `exec`.
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM:")).split()[1]) * 1024


def _resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _CountingCollectives:
    """`torch.distributed` for `parallel._collectives`, counting each collective's bytes."""

    def __init__(self, dist: Any) -> None:
        self._dist, self.calls, self.bytes = dist, {}, {}

    def _count(self, kind: str, tensor: torch.Tensor) -> None:
        self.calls[kind] = self.calls.get(kind, 0) + 1
        self.bytes[kind] = self.bytes.get(kind, 0) + tensor.numel() * tensor.element_size()

    def all_reduce(self, tensor: torch.Tensor, **kwargs: Any) -> Any:
        self._count("all_reduce", tensor)
        return self._dist.all_reduce(tensor, **kwargs)

    def all_gather_into_tensor(self, out: torch.Tensor, part: torch.Tensor, **kwargs) -> Any:
        self._count("all_gather (gathered bytes)", out)
        return self._dist.all_gather_into_tensor(out, part, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dist, name)


def _communication(model: Any, fn: Any) -> dict:
    from hookedattn.core.parallel import _collectives

    counting = _CountingCollectives(_collectives.dist)
    _collectives.dist = counting
    try:
        fn()
    finally:
        _collectives.dist = counting._dist
    return {"calls": counting.calls, "bytes": counting.bytes}


def _timed(fn: Any, inner: int) -> float:
    start = time.perf_counter()
    for _ in range(inner):
        fn()
    return (time.perf_counter() - start) / inner


def worker(spec: dict, out: Path) -> None:
    """One rank of the job (module docstring)."""
    torch.set_num_threads(1)
    from hookedattn import HookedTransformer
    from hookedattn.core import parallel
    from hookedattn.testing import random_tokens

    group = parallel.tensor_parallel_group(2)
    before = _resident()
    model = HookedTransformer.load(spec["path"], tp_size=2)
    load_peak = _high_water_mark() - before
    reference = HookedTransformer.load(spec["path"])
    tokens = random_tokens(model.cfg.d_vocab, spec["batch"], spec["pos"], seed=1)
    with torch.no_grad():
        agree = float((model(tokens) - reference(tokens)).abs().max())
        one_name = "blocks.0.attn.hook_z"
        measures = {
            "forward, no hooks attached": (lambda m: m(tokens)),
            "run_with_cache, everything": (lambda m: m.run_with_cache(tokens)),
            f"run_with_cache, one name ({one_name})": (
                lambda m: m.run_with_cache(tokens, names_filter=one_name)
            ),
        }
        communication = {
            measure: _communication(model, lambda fn=fn: fn(model))
            for measure, fn in measures.items()
        }

        def local_cache() -> Any:
            with parallel.local_activations(model):
                return model.run_with_cache(tokens)

        contenders = []
        for measure, fn in measures.items():
            contenders += [(measure, "one process", lambda fn=fn: fn(reference))]
            contenders += [(measure, "2 ranks", lambda fn=fn: fn(model))]
        contenders.append(("run_with_cache, everything", "2 ranks, local activations", local_cache))
        communication["run_with_cache, everything, local activations"] = _communication(
            model, local_cache
        )
        inner, times = _interleaved(model, [fn for _, _, fn in contenders], spec)
    slices = parallel.parameter_slices(model)
    result = {
        "rank": group.rank,
        "agree_max_abs": agree,
        "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
        "whole_weight_bytes": sum(p.numel() * p.element_size() for p in reference.parameters()),
        "sharded_parameters": len(slices),
        "load_peak_growth_bytes": load_peak,
        "communication_per_call": communication,
        "timings": [
            {"measure": m, "contender": c, "inner": inner[i], "seconds": times[i]}
            for i, (m, c, _) in enumerate(contenders)
        ],
    }
    (out / f"rank{group.rank}.json").write_text(json.dumps(result))


def _interleaved(model: Any, calls: list, spec: dict) -> tuple[list[int], dict[int, list[float]]]:
    """Each call warmed up, then timed `spec["rounds"]` times in alternating order, each
    sample as many calls as `spec["min_sample_s"]` takes (the same count on every rank)."""
    from hookedattn.core import parallel

    for fn in calls:
        fn()
    once = [_timed(fn, 1) for fn in calls]
    inner = parallel.same_on_every_rank(
        model, [max(1, round(spec["min_sample_s"] / max(t, 1e-6))) for t in once]
    )
    times: dict[int, list[float]] = {i: [] for i in range(len(calls))}
    for r in range(spec["rounds"]):
        order = range(len(calls)) if r % 2 == 0 else reversed(range(len(calls)))
        for i in order:
            times[i].append(_timed(calls[i], inner[i]))
    return inner, times


def probe_load(path: str) -> dict:
    """The high-water-mark growth of a one-process `load(path)`, in this fresh process."""
    from hookedattn import HookedTransformer
    from hookedattn.testing import tiny_model

    tiny_model()  # one-time costs of the first model a process builds
    before = _resident()
    model = HookedTransformer.load(path)
    weight = sum(p.numel() * p.element_size() for p in model.parameters())
    return {"load_peak_growth_bytes": _high_water_mark() - before, "weight_bytes": weight}


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(setting: Any, rounds: int, min_sample_s: float) -> dict:
    """Launch the job for one setting and summarise both ranks' reports."""
    from hookedattn import HookedTransformer, HookedTransformerConfig

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model"
        HookedTransformer(HookedTransformerConfig(**setting.cfg)).save(path)
        spec = dict(path=str(path), batch=setting.batch, pos=setting.pos, rounds=rounds,
                    min_sample_s=min_sample_s)  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                  "--nproc_per_node=2", str(SELF), "--worker", json.dumps(spec), tmp]  # fmt: skip
        done = subprocess.run(launch, env=env, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            raise RuntimeError(f"the distributed benchmark failed:\n{done.stderr[-3000:]}")
        ranks = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in (0, 1)]
        probe = subprocess.run([sys.executable, str(SELF), "--probe-load", str(path)], env=env,
                               capture_output=True, text=True, check=True)  # fmt: skip
        one = json.loads(probe.stdout.strip().splitlines()[-1])
    return {"ranks": ranks, "one_process_load": one}


def rows(setting_key: str, measured: dict, group_start: int) -> list[dict]:
    """Benchmark-report rows: per measure, the one-process reference and the 2-rank
    contenders, rank 0's times, each round's ratio to the reference of that round."""
    timings = measured["ranks"][0]["timings"]
    out, group = [], group_start
    for measure in dict.fromkeys(t["measure"] for t in timings):
        here = [t for t in timings if t["measure"] == measure]
        reference = here[0]["seconds"]
        for i, t in enumerate(here):
            ratio = [s / r for s, r in zip(t["seconds"], reference, strict=True)]
            out.append({
                "section": "distributed", "setting": setting_key, "group": group,
                "measure": measure if i == 0 else f"{measure}: {t['contender']}",
                "contender": "hookedattn", "reference": i == 0, "rounds": len(t["seconds"]),
                "inner": t["inner"], "median_s": statistics.median(t["seconds"]),
                "min_s": min(t["seconds"]), "max_s": max(t["seconds"]), "ratio": _summary(ratio),
            })  # fmt: skip
        group += 1
    return out


def distributed_section(run: Any, keys: tuple[str, ...] = ("a", "b")) -> None:
    """`scripts/bench`'s section: rows per setting, and the per-rank figures in `extra`."""
    if run.quick:
        run.skip("distributed", "2 ranks against 1 process",
                 "not in --quick runs (launches torchrun); python scripts/bench/distributed.py "
                 "--quick is its smoke run")  # fmt: skip
        return
    run.extra["distributed"] = {}
    for key in keys:
        setting = run.settings[key]
        print(f"distributed [{key}] {setting.description}")
        measured = measure(setting, run.rounds, run.min_sample_s)
        first_group = len({r["group"] for r in run.rows})
        run.rows += rows(key, measured, first_group)
        run.extra["distributed"][key] = _figures(measured)
        print(json.dumps(run.extra["distributed"][key], indent=1))


def _figures(measured: dict) -> dict:
    ranks, one = measured["ranks"], measured["one_process_load"]
    return {
        "weight_fraction_per_rank": [r["weight_bytes"] / r["whole_weight_bytes"] for r in ranks],
        "load_peak_growth_per_rank_MB": [r["load_peak_growth_bytes"] / 1e6 for r in ranks],
        "one_process_load_peak_growth_MB": one["load_peak_growth_bytes"] / 1e6,
        "whole_weights_MB": one["weight_bytes"] / 1e6,
        "communication_per_call": ranks[0]["communication_per_call"],
        "agree_max_abs": max(r["agree_max_abs"] for r in ranks),
    }


def main(argv: list[str] | None = None) -> int:
    """Standalone: measure, print, and write `--json` if given."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--settings", default=None, help="comma-separated, default a,b")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--probe-load", default=None, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.worker is not None:
        worker(json.loads(args.worker), Path(rest[0]))
        return 0
    if args.probe_load is not None:
        print(json.dumps(probe_load(args.probe_load)))
        return 0
    from settings import FULL, QUICK

    settings = QUICK if args.quick else FULL
    rounds = args.rounds or (3 if args.quick else 9)
    report = {"threads_per_rank": 1, "rounds": rounds, "settings": {}}
    for key in (args.settings or ("a" if args.quick else "a,b")).split(","):
        print(f"distributed [{key}] {settings[key].description}")
        measured = measure(settings[key], rounds, 0.002 if args.quick else 0.05)
        report["settings"][key] = {
            "description": settings[key].description,
            "figures": _figures(measured),
            "rows": rows(key, measured, 0),
        }
        for row in report["settings"][key]["rows"]:
            r = row["ratio"]
            print(f"  {row['measure']:<70} {row['median_s'] * 1e3:9.2f} ms  x{r['median']:.3f} "
                  f"({r['min']:.3f}-{r['max']:.3f})")  # fmt: skip
        print(json.dumps(report["settings"][key]["figures"], indent=1))
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
