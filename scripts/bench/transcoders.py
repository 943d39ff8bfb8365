"""Measure transcoder training throughput and attribution-graph cost on bytes-gelu-2l.

    python scripts/bench/transcoders.py --rounds 5 --out reports/bench_transcoders.json

Training: `train_transcoder` against a plain loop (the same batches from the same store,
encode, TopK, decode, squared error, Adam, unit decoder rows; nothing else), in interleaved
rounds of `--steps` steps each, one thread, CPU time per step; the ratio is reported per
round (median and range). Graphs: `attribution_graph` of the shipped transcoders on
held-out prompts of 16 to 128 tokens, and of untrained TopK transcoders with k from 8 to 64
(the number of active features) on a 64-token prompt: CPU seconds (median of rounds), the
backward sweeps run, the nodes and edges, and the peak resident memory the graph added
(measured in a fresh process per case: `ru_maxrss` after the graph minus before it).
"""

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from hookedattn import HookedTransformer
from hookedattn.sae import train_transcoder
from hookedattn.store import ActivationStore, collect_activations

MODEL = "bytes-gelu-2l"
NAMES = [f"blocks.{i}.{h}" for i in range(2) for h in ("ln2.hook_out", "hook_mlp_out")]


def plain_loop(store, steps: int, d_sae: int, k: int, batch_size: int, seed: int) -> None:
    """The least a TopK transcoder's training does, on the same batches as `train_transcoder`."""
    torch.manual_seed(seed)
    x_name, y_name = NAMES[2], NAMES[3]
    stats = [store.stats(n) for n in (x_name, y_name)]
    mean = [s.mean.float() for s in stats]
    scale = [float(s.var.mean().sqrt()) for s in stats]
    W_enc = torch.randn(64, d_sae).div_(8).requires_grad_()
    b_enc = torch.zeros(d_sae, requires_grad=True)
    W_dec = torch.randn(d_sae, 64).requires_grad_()
    b_dec = torch.zeros(64, requires_grad=True)
    optimizer = torch.optim.Adam([W_enc, b_enc, W_dec, b_dec], lr=1e-3)
    xs = store.batches(x_name, batch_size, shuffle=True, seed=seed, drop_last=True)
    ys = store.batches(y_name, batch_size, shuffle=True, seed=seed, drop_last=True)
    for _, x, y in zip(range(steps), xs, ys, strict=False):
        x, y = (x - mean[0]) / scale[0], (y - mean[1]) / scale[1]
        pre = x @ W_enc + b_enc
        values, index = pre.topk(k, dim=-1)
        acts = torch.zeros_like(pre).scatter(-1, index, values.relu())
        loss = (acts @ W_dec + b_dec - y).pow(2).sum(-1).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        with torch.no_grad():
            W_dec.div_(W_dec.norm(dim=-1, keepdim=True))


def bench_training(store, rounds: int, steps: int) -> dict:
    """CPU seconds per step of `train_transcoder` and of the plain loop, interleaved."""
    args = dict(d_sae=1024, k=16, batch_size=1024)
    ours, plain = [], []
    for r in range(rounds):
        started = time.process_time()
        train_transcoder(store, 1, steps=steps, progress=False, seed=r, **args)
        ours.append((time.process_time() - started) / steps)
        started = time.process_time()
        plain_loop(store, steps, seed=r, **args)
        plain.append((time.process_time() - started) / steps)
    ratios = [a / b for a, b in zip(ours, plain, strict=True)]
    return {
        "steps_per_round": steps, "rounds": rounds, "batch_size": 1024, "d_sae": 1024, "k": 16,
        "train_transcoder_s_per_step": statistics.median(ours),
        "plain_loop_s_per_step": statistics.median(plain),
        "rows_per_s_train_transcoder": 1024 / statistics.median(ours),
        "rows_per_s_plain_loop": 1024 / statistics.median(plain),
        "ratio_median": statistics.median(ratios), "ratio_range": [min(ratios), max(ratios)],
    }  # fmt: skip


GRAPH_CASE = """
import json, resource, sys, time, torch
torch.set_num_threads(1)
from hookedattn import HookedTransformer
from hookedattn.sae import CrossLayerTranscoder, CrossLayerTranscoderConfig, Transcoder
from hookedattn.sae import TranscoderConfig, load_pretrained_transcoders
from hookedattn.training.corpus import heldout_windows, load_stdlib_corpus
from analysis.attribution_graphs import attribution_graph
kind, n_pos, k, rounds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
model = HookedTransformer.from_pretrained("bytes-gelu-2l")
if k == 0:
    tcs = load_pretrained_transcoders("bytes-gelu-2l", kind, model=model)
elif kind == "cross_layer":
    tcs = CrossLayerTranscoder(CrossLayerTranscoderConfig(2, 64, 1024, 64, "topk", k))
else:
    tcs = [Transcoder(TranscoderConfig(64, 1024, 64, f"blocks.{i}.ln2.hook_out",
           f"blocks.{i}.hook_mlp_out", "topk", k, skip=True)) for i in range(2)]
tokens = heldout_windows(load_stdlib_corpus().heldout, 8, n_pos)[3]
attribution_graph(model, tcs, tokens[:8], top_k=5)  # warm up
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
seconds = []
for _ in range(rounds):
    started = time.process_time()
    graph = attribution_graph(model, tcs, tokens, top_k=5)
    seconds.append(time.process_time() - started)
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"kind": kind, "n_pos": n_pos, "k": k, "cpu_seconds": sorted(seconds),
                  "features": graph.n_features, "nodes": graph.n_nodes,
                  "edges": int((graph.adjacency != 0).sum()),
                  "backward_batches": graph.backward_batches,
                  "adjacency_mib": graph.adjacency.numel() * 4 / 2**20,
                  "peak_rss_added_mib": (after - before) / 1024}))
"""


def bench_graph(kind: str, n_pos: int, k: int, rounds: int) -> dict:
    """One graph case in a fresh process (module docstring); k=0: the shipped transcoders."""
    proc = subprocess.run(
        [sys.executable, "-c", GRAPH_CASE, kind, str(n_pos), str(k), str(rounds)],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    if proc.returncode != 0:
        raise RuntimeError(f"the graph case {kind, n_pos, k} failed:\n{proc.stderr[-3000:]}")
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["cpu_seconds_median"] = statistics.median(result["cpu_seconds"])
    return result


def main() -> None:
    """Run the measurements and write them as JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--tokens", type=float, default=1.5e5)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--only", choices=("training", "graphs"), default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    model = HookedTransformer.from_pretrained(MODEL)
    results: dict = {"threads": 1, "timer": "CPU time (time.process_time)", "graphs": []}
    if args.only != "graphs":
        with tempfile.TemporaryDirectory() as acts:
            collect_activations(model, None, names=NAMES, out=acts, context=128,
                                n_tokens=args.tokens, batch_size=32, progress=False)  # fmt: skip
            results["training"] = bench_training(ActivationStore(acts), args.rounds, args.steps)
        print(json.dumps(results["training"]), flush=True)
    cases = [(kind, n, 0) for kind in ("per_layer", "cross_layer") for n in (16, 32, 64, 128)]
    cases += [("per_layer", 64, k) for k in (8, 32, 64)]
    for kind, n_pos, k in cases if args.only != "training" else []:
        results["graphs"].append(bench_graph(kind, n_pos, k, min(args.rounds, 3)))
        print(json.dumps(results["graphs"][-1]), flush=True)
    results["peak_rss_mib_of_this_process"] = (
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
