"""Peak memory and time of attribution graphs against the prompt's length.

    python scripts/bench/graph_memory.py                      # the recorded cases (long)
    python scripts/bench/graph_memory.py --quick              # tiny settings, a smoke run
    python scripts/bench/graph_memory.py --json scripts/data/graph_memory.json

Each case runs in a fresh process with one thread: the model and transcoders are built, a
graph of an 8-token prompt warms the code up, then one graph of the case's prompt is made.
Peak memory is the resident set the graph added (`ru_maxrss` after it less before it),
time is wall clock with the process's CPU time beside it. Two ways to the pruned graph:

- `dense`: `prune_graph(attribution_graph(...))`, the `[node node]` matrix first;
- `streamed`: `pruned_attribution_graph(...)` under `--budget`, with at most
  `--max-feature-nodes` features kept (the kept block would otherwise grow with the
  square of the kept features);
- `freeze`: the frozen forward alone (`_frozen.freeze`, which every graph starts with),
  and the queries and keys it keeps in place of the attention patterns.

Two models: the shipped `bytes-gelu-2l` with its per-layer transcoders (learned
positional embeddings, so at most its `n_ctx`, 128 tokens), and a random one without a
context limit (rotary positions, 4 layers, d_model 256, TopK transcoders of `--k` features
a position, random weights), and a light random one shaped like the shipped model (2
layers, d_model 64, rotary, `--light-k` features a position) for the longest prompts: the
time grows faster than the square of the length (every feature's row is computed, and a
row's sweep carries the prompt through every layer's attention). The scaling exponent is
the slope of a least-squares line through log(peak memory) against log(tokens);
`ratio_4x` divides the memory at the longest prompt by that at a quarter of its length,
where both were measured.
"""

import argparse
import json
import math
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
MODELS = ["bytes-gelu-2l", "random-d256-4l", "random-d64-2l"]

CASE = """
import json, resource, sys, time, torch
torch.set_num_threads(1)
from analysis.attribution_graphs import attribution_graph, prune_graph, pruned_attribution_graph
model_name, mode, n_pos, k, budget, max_features = sys.argv[1:7]
n_pos, k, max_features = int(n_pos), int(k), int(max_features) or None
if model_name == "bytes-gelu-2l":
    from hookedattn import HookedTransformer
    from hookedattn.sae import load_pretrained_transcoders
    from hookedattn.training.corpus import heldout_windows, load_stdlib_corpus
    model = HookedTransformer.from_pretrained(model_name)
    tcs = load_pretrained_transcoders(model_name, "per_layer", model=model)
    tokens = heldout_windows(load_stdlib_corpus().heldout, 8, n_pos)[3]
else:
    from hookedattn.sae import Transcoder, TranscoderConfig
    from hookedattn.testing import random_tiny_model
    d, n_layers = (256, 4) if model_name == "random-d256-4l" else (64, 2)
    model = random_tiny_model(n_layers=n_layers, d_model=d, n_heads=8, d_mlp=4 * d,
                              n_ctx=max(n_pos, 16), d_vocab=512, dtype=torch.float32,
                              act_fn="gelu", positional_embedding_type="rotary")
    torch.manual_seed(0)
    tcs = [Transcoder(TranscoderConfig(d, 8 * d, d, f"blocks.{i}.ln2.hook_out",
                                       f"blocks.{i}.hook_mlp_out", "topk", k=k))
           for i in range(n_layers)]
    tokens = torch.randint(0, 512, (n_pos,), generator=torch.Generator().manual_seed(1))

def graph(tokens):
    if mode == "freeze":  # the frozen forward alone: what every graph starts with
        from analysis.attribution_graphs import _frozen
        from hookedattn.sae import TranscoderSet
        return _frozen.freeze(model, TranscoderSet(tcs), tokens)
    if mode == "dense":
        return prune_graph(attribution_graph(model, tcs, tokens, top_k=5, max_bytes=2**40))
    return pruned_attribution_graph(model, tcs, tokens, top_k=5, memory_budget=budget,
                                    max_feature_nodes=max_features, progress=False)

graph(tokens[:8])  # warm up
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
wall, cpu = time.perf_counter(), time.process_time()
pruned = graph(tokens)
wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
if mode == "freeze":
    print(json.dumps({"model": model_name, "mode": mode, "tokens": n_pos,
                      "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                      "peak_rss_added_mib": round((after - before) / 1024, 1),
                      "queries_keys_held_mib": round(sum(t.numel() * t.element_size()
                          for s in pruned.scores for t in (s.queries, s.keys)) / 2**20, 2)}))
    sys.exit(0)
g = pruned.graph if mode == "dense" else pruned
print(json.dumps({
    "model": model_name, "mode": mode, "tokens": n_pos,
    "k": None if model_name == "bytes-gelu-2l" else k,
    "budget": budget if mode == "streamed" else None,
    "max_feature_nodes": max_features if mode == "streamed" else None,
    "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
    "peak_rss_added_mib": round((after - before) / 1024, 1),
    "nodes": g.n_nodes, "features": g.n_features,
    "dense_adjacency_mib": round(g.n_nodes ** 2 * g.activations.element_size() / 2**20, 1),
    "kept_nodes": pruned.n_nodes if mode == "dense" else int(pruned.node_mask.sum()),
    "kept_features": len(pruned.kept_features()), "edges_kept": pruned.n_edges,
    "sweeps": pruned.graph.backward_batches if mode == "dense" else pruned.sweeps,
}))
"""


def run_case(model: str, mode: str, n_pos: int, k: int, budget: str, max_features: int,
             timeout: float) -> dict[str, Any]:  # fmt: skip
    """One case in a fresh process (module docstring); a note instead where it fails or
    runs past `timeout` seconds."""
    args = [model, mode, str(n_pos), str(k), budget, str(max_features)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    try:
        proc = subprocess.run([sys.executable, "-c", CASE, *args], capture_output=True,
                              text=True, cwd=ROOT, env=env, timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return {"model": model, "mode": mode, "tokens": n_pos, "not_measured":
                f"ran past the {timeout:.0f} s limit per case"}  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"the case {args} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def exponent(rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The least-squares slope of log(peak memory) against log(tokens), and the ratio of
    the memory at the longest prompt to that at a quarter of its length."""
    points = [(r["tokens"], r["peak_rss_added_mib"]) for r in rows if "peak_rss_added_mib" in r]
    if len(points) < 2:
        return None
    xs, ys = [math.log(n) for n, _ in points], [math.log(max(m, 1e-3)) for _, m in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    memory = dict(points)
    longest = max(memory)
    ratio = memory[longest] / memory[longest // 4] if longest // 4 in memory else None
    return {"tokens": sorted(memory), "exponent": round(slope, 3),
            "ratio_4x": None if ratio is None else round(ratio, 2)}  # fmt: skip


def main() -> None:
    """Run the cases and print (and with `--json`, write) the results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--budget", default="256MiB")
    parser.add_argument("--max-feature-nodes", type=int, default=1024)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--timeout", type=float, default=330.0, help="seconds per case")
    parser.add_argument("--random-tokens", type=int, nargs="+", default=[64, 128, 256, 512])
    parser.add_argument("--dense-tokens", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--light-tokens", type=int, nargs="*", default=[256, 1024, 2048, 4096])
    parser.add_argument("--light-k", type=int, default=1)
    parser.add_argument("--freeze-tokens", type=int, nargs="*", default=[1024, 2048, 4096])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--json", type=Path, default=None, help="merged into, if it exists")
    args = parser.parse_args()
    shipped = [32, 64, 128]
    random_lengths, dense_lengths = args.random_tokens, args.dense_tokens
    if args.quick:
        shipped, random_lengths, dense_lengths = [16, 32], [16, 32], [16, 32]
        args.light_tokens = args.freeze_tokens = [16, 32]
    cases = [("bytes-gelu-2l", mode, n) for mode in ("dense", "streamed") for n in shipped]
    cases += [("random-d256-4l", "dense", n) for n in dense_lengths]
    cases += [("random-d256-4l", "streamed", n) for n in random_lengths]
    cases += [("random-d64-2l", "streamed", n) for n in args.light_tokens]
    cases += [("random-d64-2l", "freeze", n) for n in args.freeze_tokens]
    cases = [case for case in cases if case[0] in args.models]
    results: list[dict[str, Any]] = []
    for model, mode, n_pos in cases:
        k = args.light_k if model == "random-d64-2l" else args.k
        results.append(run_case(model, mode, n_pos, k, args.budget,
                                args.max_feature_nodes, args.timeout))  # fmt: skip
        print(json.dumps(results[-1]), flush=True)
    if args.json is not None and args.json.exists():  # keep the cases not rerun
        ran = {(r["model"], r["mode"], r["tokens"]) for r in results}
        earlier = json.loads(args.json.read_text())["cases"]
        results = [r for r in earlier if (r["model"], r["mode"], r["tokens"]) not in ran] + results
    results.sort(key=lambda r: (MODELS.index(r["model"]), r["mode"], r["tokens"]))
    _report(args, results)


def _report(args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    """Print the fitted scaling, and write the whole report where `--json` says."""
    fits = {}
    for model, mode in sorted({(r["model"], r["mode"]) for r in results}):
        fits[f"{model} {mode}"] = exponent(
            [r for r in results if r["model"] == model and r["mode"] == mode]
        )
    report = {
        "machine": f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
        "shared with other jobs",
        "threads": 1,
        "budget": args.budget,
        "max_feature_nodes": args.max_feature_nodes,
        "random_models": {
            "random-d256-4l": {
                "n_layers": 4,
                "d_model": 256,
                "n_heads": 8,
                "d_sae": 2048,
                "k": args.k,
                "positions": "rotary",
                "dtype": "float32",
            },
            "random-d64-2l": {
                "n_layers": 2,
                "d_model": 64,
                "n_heads": 8,
                "d_sae": 512,
                "k": args.light_k,
                "positions": "rotary",
                "dtype": "float32",
            },
        },
        "cases": results,
        "scaling": fits,
    }
    print(json.dumps(fits, indent=2))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
