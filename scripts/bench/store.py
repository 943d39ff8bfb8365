"""Benchmarks of the activation store (`hookedattn.store`): collection, memory, reading, ranks.

    python scripts/bench/store.py              # every measure (a few minutes on 2 cores)
    python scripts/bench/store.py --quick      # tiny settings: a smoke run
    python scripts/bench/store.py --json out.json

1. Collection throughput against a plain forward without hooks over the same contexts
   (stopping at the same layer), interleaved in rounds (plain, collect, collect, plain, ...)
   so that a slow spell on a shared machine hits both; the median ratio and its range.
   Both the shipped 2-layer model and a GPT-2-small-shaped one (random weights).
2. Peak resident memory of a collection subprocess at 1e5 and 1e6 tokens (fixed shard size).
3. Shuffled reading (`ActivationStore.batches(shuffle=True)`) from the page cache, GB/s.
   With `--only verify`: the first read of a freshly opened store with its content hashes
   checked against the same read unchecked (`verify_content=False`), interleaved.
4. Tokens/s of 2 ranks (`torchrun --nproc_per_node=2`, 1 thread each) against 1 rank.

Every timing is wall clock, with the process's CPU time beside it; threads are stated.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
RESID = "blocks.1.hook_resid_pre"


def shipped() -> Any:
    """The shipped 2-layer attention-only model, whatever its current name."""
    from hookedattn import HookedTransformer, list_pretrained

    names = [info.name for info in list_pretrained() if info.name.endswith("attn-only-2l")]
    return HookedTransformer.from_pretrained(names[0])


def gpt2_small_shape() -> Any:
    """The benchmark's GPT-2-small-shaped model (setting b: 12 layers, d_model 768), random."""
    from settings import FULL

    from hookedattn import ByteTokenizer, HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(**FULL["b"].cfg)
    return HookedTransformer(cfg, tokenizer=ByteTokenizer())


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def throughput(model: Any, name: str, n_tokens: float, context: int, rounds: int) -> dict:
    """Collection tokens/s against a plain forward (same contexts, same stop layer)."""
    from hookedattn.store import pack
    from hookedattn.store.collection import _stop_layer

    packed = pack(model, None, context=context, n_tokens=n_tokens)
    stop = _stop_layer([name], model.cfg.n_layers)

    def plain() -> tuple[float, float]:
        return _plain_pass(model, packed, stop)

    def collect() -> tuple[float, float]:
        return _collect_pass(model, name, context, n_tokens)

    plain()  # warm-up
    ratios, plain_tps, collect_tps, cpu_ratio, plain_cpu_tps = [], [], [], [], []
    for r in range(rounds):
        order = (plain, collect) if r % 2 == 0 else (collect, plain)
        results = {f: f() for f in order}
        (p_wall, p_cpu), (c_wall, c_cpu) = results[plain], results[collect]
        ratios.append(p_wall / c_wall)
        plain_tps.append(packed.n_tokens / p_wall)
        collect_tps.append(packed.n_tokens / c_wall)
        cpu_ratio.append(c_cpu / p_cpu)
        plain_cpu_tps.append(packed.n_tokens / p_cpu)
    return {
        "name": name,
        "tokens": packed.n_tokens,
        "context": context,
        "stop_at_layer": stop,
        "ratio": _spread(ratios),
        "plain_tok_s": _spread(plain_tps),
        "collect_tok_s": _spread(collect_tps),
        "cpu_time_ratio": _spread(cpu_ratio),
        "plain_tok_per_cpu_s": _spread(plain_cpu_tps),
    }


def _plain_pass(model: Any, packed: Any, stop: int) -> tuple[float, float]:
    """Wall and CPU seconds of plain forwards over the packed contexts, 32 at a time."""
    wall, cpu = time.perf_counter(), time.process_time()
    with torch.inference_mode():
        for start in range(0, len(packed), 32):
            tokens = packed.contexts(start, min(start + 32, len(packed)))
            model(tokens, return_type=None, stop_at_layer=stop)
    return time.perf_counter() - wall, time.process_time() - cpu


def _collect_pass(model: Any, name: str, context: int, n_tokens: float) -> tuple[float, float]:
    """Wall and CPU seconds of `collect_activations` of `name` into a scratch folder."""
    from hookedattn.store import collect_activations

    out = Path(tempfile.mkdtemp(prefix="bench-store-"))
    try:
        done = collect_activations(
            model,
            None,
            names=[name],
            out=out,
            context=context,
            n_tokens=n_tokens,
            dtype=torch.bfloat16,
            progress=False,
        )
        return done.seconds, done.cpu_seconds
    finally:
        _remove(out)


def _remove(out: str | Path) -> None:
    shutil.rmtree(out, ignore_errors=True)
    for rank in (0, 1):
        Path(f"{out}.rank{rank}.json").unlink(missing_ok=True)


def _child(args: list[str]) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True, cwd=ROOT)
    return json.loads(done.stdout.strip().splitlines()[-1])


def worker(out: str, n_tokens: float, shard_contexts: int) -> None:
    """One collection (one rank of it under torchrun); prints its numbers as JSON."""
    from hookedattn.store import collect_activations, init_from_env

    torch.set_num_threads(1)
    ranks = init_from_env()
    model = shipped()
    done = collect_activations(
        model,
        None,
        names=[RESID],
        out=out,
        n_tokens=n_tokens,
        dtype=torch.bfloat16,
        shard_contexts=shard_contexts,
        progress=False,
    )
    # VmHWM, not ru_maxrss: the latter survives exec, so a child started by a process
    # holding a big model would report the parent's peak.
    status = Path("/proc/self/status").read_text().split("VmHWM:")[1]
    peak_kib = int(status.split()[0])
    report = {
        "rank": ranks.rank,
        "tokens": done.tokens,
        "seconds": done.seconds,
        "cpu_seconds": done.cpu_seconds,
        "peak_rss_mib": peak_kib / 1024,
    }
    # Beside the store, one file per rank: ranks printing at once would mix their lines.
    Path(f"{out}.rank{ranks.rank}.json").write_text(json.dumps(report))
    print(json.dumps(report))


def peak_memory(token_counts: list[float], shard_contexts: int) -> list[dict]:
    """Peak RSS of a collection subprocess for each number of tokens."""
    rows = []
    for n in token_counts:
        out = tempfile.mkdtemp(prefix="bench-store-")
        try:
            report = _child(["--worker", out, str(n), str(shard_contexts)])
        finally:
            _remove(out)

        rows.append({"tokens": n, **report})
    return rows


def shuffled_read(n_tokens: float, shard_contexts: int, epochs: int) -> dict:
    """GB/s of shuffled batches of 4096 rows, the store's files in the page cache."""
    from hookedattn.store import ActivationStore

    out = tempfile.mkdtemp(prefix="bench-store-")
    try:
        _child(["--worker", out, str(n_tokens), str(shard_contexts)])
        store = ActivationStore(out)
        row_bytes = store.dtype.itemsize * store.row_shape(RESID)[0]
        for _ in store.batches(RESID, 4096):  # warm the page cache and the maps
            pass
        rates, cpu_rates = [], []
        for seed in range(epochs):
            wall, cpu = time.perf_counter(), time.process_time()
            n = sum(b.shape[0] for b in store.batches(RESID, 4096, shuffle=True, seed=seed))
            rates.append(n * row_bytes / (time.perf_counter() - wall) / 1e9)
            cpu_rates.append(n * row_bytes / (time.process_time() - cpu) / 1e9)
        return {
            "rows": len(store),
            "row_bytes": row_bytes,
            "shards": len(store._shards),
            "gb_s_wall": _spread(rates),
            "gb_s_cpu": _spread(cpu_rates),
        }
    finally:
        _remove(out)


def verified_read(n_tokens: float, shard_contexts: int, rounds: int) -> dict:
    """GB/s of a freshly opened store's first full read with its content hashes checked
    (`verify_content=True`, the default: every tensor hashed on its first read) against
    the same read with `verify_content=False`, in interleaved rounds (on, off, off, on,
    ...), the files in the page cache; then a second read of the verified store (nothing
    left to hash) and `verify()` of the whole store."""
    from hookedattn.store import ActivationStore

    out = tempfile.mkdtemp(prefix="bench-store-")
    try:
        _child(["--worker", out, str(n_tokens), str(shard_contexts)])
        warm = ActivationStore(out, verify_content=False)
        row_bytes = warm.dtype.itemsize * warm.row_shape(RESID)[0]
        for _ in warm.batches(RESID, 4096):  # the files into the page cache
            pass

        def read(store: Any) -> float:
            wall = time.perf_counter()
            n = sum(b.shape[0] for b in store.batches(RESID, 4096, shuffle=True, seed=0))
            return n * row_bytes / (time.perf_counter() - wall) / 1e9

        first = {True: [], False: []}
        again = []
        for r in range(rounds):
            for verify in (True, False) if r % 2 == 0 else (False, True):
                store = ActivationStore(out, verify_content=verify)
                first[verify].append(read(store))
                if verify:
                    again.append(read(store))
        wall = time.perf_counter()
        ActivationStore(out).verify()
        verify_s = time.perf_counter() - wall
        ratios = [on / off for on, off in zip(first[True], first[False], strict=True)]
        return {
            "rows": len(warm),
            "shards": len(warm._shards),
            "store_mb": warm.nbytes / 1e6,
            "first_read_gb_s_verified": _spread(first[True]),
            "first_read_gb_s_unverified": _spread(first[False]),
            "first_read_ratio_verified_to_unverified": _spread(ratios),
            "second_read_gb_s_verified": _spread(again),
            "verify_all_gb_s": warm.nbytes / verify_s / 1e9,
        }
    finally:
        _remove(out)


def ranks(n_tokens: float, shard_contexts: int, rounds: int) -> dict:
    """Aggregate tokens/s of 2 ranks under torchrun against 1 rank (1 thread each)."""
    speedups, one_tps, two_tps = [], [], []
    for _ in range(rounds):
        out = tempfile.mkdtemp(prefix="bench-store-")
        try:
            one = _child(["--worker", out, str(n_tokens), str(shard_contexts)])
        finally:
            _remove(out)
        out = tempfile.mkdtemp(prefix="bench-store-")
        try:
            command = [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--standalone",
                "--nproc_per_node=2",
                str(Path(__file__).resolve()),
                "--worker",
                out,
                str(n_tokens),
                str(shard_contexts),
            ]
            subprocess.run(command, capture_output=True, text=True, check=True, cwd=ROOT)
            reports = [json.loads(Path(f"{out}.rank{r}.json").read_text()) for r in (0, 1)]
        finally:
            _remove(out)

        two = sum(r["tokens"] for r in reports) / max(r["seconds"] for r in reports)
        one_tps.append(one["tokens"] / one["seconds"])
        two_tps.append(two)
        speedups.append(two / one_tps[-1])
    return {
        "tokens": n_tokens,
        "one_rank_tok_s": _spread(one_tps),
        "two_ranks_tok_s": _spread(two_tps),
        "speedup": _spread(speedups),
    }


def main(argv: list[str] | None = None) -> int:
    """Run the measures and print them (as JSON, and to `--json` if given)."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", nargs=3, metavar=("OUT", "TOKENS", "SHARD_CONTEXTS"))
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args.worker[0], float(args.worker[1]), int(args.worker[2]))
        return 0
    torch.set_num_threads(1)
    quick = args.quick
    shard = 64  # 64 contexts of 128 rows of 64 bfloat16: 1 MiB shards
    wanted = set(args.only or ["throughput", "memory", "read", "verify", "ranks"])
    results: dict[str, Any] = {
        "threads": 1,
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
    }
    if "throughput" in wanted:
        results["throughput_shipped"] = throughput(
            shipped(), RESID, 2e4 if quick else 2e5, 128, 2 if quick else 5
        )
        print(json.dumps(results["throughput_shipped"]), flush=True)
        results["throughput_gpt2_small"] = throughput(
            gpt2_small_shape(),
            "blocks.6.hook_resid_pre",
            1024 if quick else 4096,
            128,
            2 if quick else 3,
        )
        print(json.dumps(results["throughput_gpt2_small"]), flush=True)
    if "memory" in wanted:
        results["peak_memory"] = peak_memory([1e4, 1e5] if quick else [1e5, 1e6], shard)
        print(json.dumps(results["peak_memory"]), flush=True)
    if "read" in wanted:
        results["shuffled_read"] = shuffled_read(1e5 if quick else 1e6, shard, 2 if quick else 5)
        print(json.dumps(results["shuffled_read"]), flush=True)
    if "verify" in wanted:
        results["verified_read"] = verified_read(4e4 if quick else 1e6, shard, 2 if quick else 7)
        print(json.dumps(results["verified_read"]), flush=True)
    if "ranks" in wanted:
        results["ranks"] = ranks(2e4 if quick else 4e5, shard, 1 if quick else 3)
        print(json.dumps(results["ranks"]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
