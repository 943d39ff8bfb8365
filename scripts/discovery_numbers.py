"""The measured numbers of `docs/guide/discovery.md`: agreement and cost of each method.

    python scripts/discovery_numbers.py                  # prints the Markdown tables
    python scripts/discovery_numbers.py --rounds 5 --threads 1

On each shipped 2-layer model, with the induction report's prompts (the first `--n-seq`
repeated random byte sequences, against the same with the first copy re-drawn; the loss
on the second copy), every edge is scored by exact edge patching, EAP and EAP-IG at 1, 5
and 20 steps: Spearman's rank correlation (signed scores and magnitudes) and the top-10
overlap against the exact effects. Costs are wall times in this process, in interleaved
rounds (each method once per round, in turn), as multiples of one plain forward of the
same prompts timed in the same rounds: medians with the min-max of the rounds' ratios.
Peak memory is each method's peak resident memory above the process's before it, each in
a fresh process (Linux `VmHWM`, reset through `/proc/self/clear_refs`).
"""

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

# The benchmark's and the induction report's modules, by their plain names: memory.py from
# scripts/bench/, discovery.py from scripts/induction/.
sys.path.insert(0, str(Path(__file__).resolve().parent / "bench"))
sys.path.insert(0, str(Path(__file__).resolve().parent / "induction"))
from discovery import prompts
from memory import reset_peak_rss, status_bytes

from analysis import acdc, compare_edge_scores, edge_attribution, edge_patching
from analysis.induction import PERIOD, repeated_tokens
from hookedattn import HookedTransformer

MODELS = ("bytes-attn-only-2l", "bytes-gelu-2l")
STEPS = (1, 5, 20)
THRESHOLD = 0.1
KEY_EDGE = "L0H5 -> L1H2.k"  # the previous-token head into the induction head's keys


def methods(model: HookedTransformer, kwargs: dict) -> dict[str, Callable[[], object]]:
    """Every measured call, by name."""
    out: dict[str, Callable[[], object]] = {
        "one forward": lambda: _forward(model, kwargs),
        "EAP": lambda: edge_attribution(model, **kwargs),
    }
    for n in STEPS:
        out[f"EAP-IG, {n} steps"] = lambda n=n: edge_attribution(
            model, **kwargs, method="eap-ig", ig_steps=n
        )
    out["exact edge patching"] = lambda: edge_patching(model, **kwargs)
    out["exact edge patching (loop: one forward per edge)"] = lambda: _loop(model, kwargs)
    out[f"ACDC, threshold {THRESHOLD}"] = lambda: acdc(model, **kwargs, threshold=THRESHOLD)
    return out


def _forward(model: HookedTransformer, kwargs: dict) -> torch.Tensor:
    with torch.no_grad():
        return kwargs["metric"](model(kwargs["clean_tokens"]))


def _loop(model: HookedTransformer, kwargs: dict) -> torch.Tensor:
    from analyses import _edge_patching_loop  # scripts/bench/analyses.py

    return _edge_patching_loop(model, kwargs)


def agreement(model: HookedTransformer, kwargs: dict) -> list[dict]:
    """Each attribution against the exact effects, and which edge each puts first into
    the induction head's keys."""
    exact = edge_patching(model, **kwargs)
    runs = [edge_attribution(model, **kwargs)]
    runs += [edge_attribution(model, **kwargs, method="eap-ig", ig_steps=n) for n in STEPS]
    rows = []
    for scores in [exact, *runs]:
        a = compare_edge_scores(scores, exact)
        rows.append(
            {
                "method": a.method,
                "spearman": a.spearman,
                "spearman_abs": a.spearman_abs,
                "top10": a.top_overlap,
                "into L1H2.k": scores.top(1, receiver="L1H2.k").rows[0][0],
                KEY_EDGE: scores[KEY_EDGE],
            }
        )
    return rows


def second_copy_corrupted(model: HookedTransformer, n_seq: int) -> dict:
    """The other corruption, the *second* copy re-drawn: the exact effects into L1H2.k."""
    kwargs = prompts(repeated_tokens(n_seq=n_seq), PERIOD)
    clean = kwargs["clean_tokens"]
    corrupted = clean.clone()
    generator = torch.Generator().manual_seed(1)
    corrupted[:, PERIOD + 1 :] = torch.randint(
        0, 256, corrupted[:, PERIOD + 1 :].shape, generator=generator
    )
    exact = edge_patching(model, **(kwargs | {"corrupted_tokens": corrupted}))
    return {row[0]: row[3] for row in exact.top(3, receiver="L1H2.k").rows}


def costs(model: HookedTransformer, kwargs: dict, rounds: int) -> dict[str, dict]:
    """Seconds of each method per round, interleaved, and their ratios to one forward."""
    calls = methods(model, kwargs)
    for fn in calls.values():  # warm up: first-call costs (the pass-cost probe) are paid here
        fn()
    seconds: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(rounds):
        order = list(calls) if r % 2 == 0 else list(reversed(calls))
        for name in order:
            start = time.perf_counter()
            calls[name]()
            seconds[name].append(time.perf_counter() - start)
    forward = seconds["one forward"]
    out = {}
    for name, times in seconds.items():
        ratios = [t / f for t, f in zip(times, forward, strict=True)]
        out[name] = {
            "median_s": statistics.median(times),
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios),
            "ratio_max": max(ratios),
        }
    return out


def peak_memory(name: str, method: str, n_seq: int) -> int:
    """The method's peak resident memory above the process's, in a fresh process."""
    spec = json.dumps({"model": name, "method": method, "n_seq": n_seq})
    command = [sys.executable, __file__, "--probe", spec]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return int(done.stdout.strip().splitlines()[-1])


def _probe(spec: dict) -> int:
    model = HookedTransformer.from_pretrained(spec["model"])
    kwargs = prompts(repeated_tokens(n_seq=spec["n_seq"]), PERIOD)
    call = methods(model, kwargs)[spec["method"]]
    _forward(model, prompts(repeated_tokens(n_seq=1), PERIOD))  # first-call allocations
    baseline = status_bytes("VmRSS")
    if not reset_peak_rss() or baseline is None:
        raise RuntimeError("peak resident memory cannot be reset here")
    call()
    return status_bytes("VmHWM") - baseline


def markdown(report: dict) -> tuple[str, str]:
    """The guide's two tables from a report: agreement, and costs with peak memory."""
    names = list(report["models"])
    lines = [
        "| model | method | Spearman (signed) | Spearman (\\|score\\|) | top-10 overlap | "
        f"`{KEY_EDGE}` | top edge into L1H2.k |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in names:
        for row in report["models"][name]["agreement"]:
            # L0H5 and L1H2 are the previous-token and induction heads of the first model only.
            key = f"{row[KEY_EDGE]:+.3f} | `{row['into L1H2.k']}`" if name == MODELS[0] else "- | -"
            lines.append(
                f"| `{name}` | {row['method']} | {row['spearman']:.3f} | {row['spearman_abs']:.3f} "
                f"| {row['top10']:.1f} | {key} |"
            )
    agreement = "\n".join(lines)
    lines = [
        "| method | "
        + " | ".join(f"`{n}`: x forward (min-max) | s | peak MB" for n in names)
        + " |",
        "|---|" + "---|---|---|" * len(names),
    ]
    for method in report["models"][names[0]]["costs"]:
        cells = []
        for name in names:
            c = report["models"][name]["costs"][method]
            peak = report["models"][name]["peak_bytes"][method] / 2**20
            cells.append(
                f"{c['ratio']:.1f} ({c['ratio_min']:.1f}-{c['ratio_max']:.1f}) | "
                f"{c['median_s']:.3f} | {peak:.0f}"
            )
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return agreement, "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Measure and print the tables (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--n-seq", type=int, default=8)
    parser.add_argument("--probe", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.probe is not None:
        print(_probe(json.loads(args.probe)))
        return 0
    report = {
        "threads": args.threads,
        "rounds": args.rounds,
        "n_seq": args.n_seq,
        "torch": torch.__version__,
        "models": {},
    }
    for name in MODELS:
        model = HookedTransformer.from_pretrained(name)
        kwargs = prompts(repeated_tokens(n_seq=args.n_seq), PERIOD)
        entry = {"agreement": agreement(model, kwargs), "costs": costs(model, kwargs, args.rounds)}
        if name == MODELS[0]:
            entry["second copy re-drawn, into L1H2.k"] = second_copy_corrupted(model, args.n_seq)
        entry["peak_bytes"] = {m: peak_memory(name, m, args.n_seq) for m in entry["costs"]}
        report["models"][name] = entry
        print(json.dumps({name: entry}, indent=1), flush=True)
    print(json.dumps(report))
    for table in markdown(report):
        print(f"\n{table}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
