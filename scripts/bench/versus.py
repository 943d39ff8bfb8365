"""This tree's hookedattn against an earlier revision's, in one process, interleaved.

    python scripts/bench/versus.py c4b5ec6                      # forward, generate, caches
    python scripts/bench/versus.py main --settings s64,a --measures forward,generate

A change is "nothing slower than before" when its time over the earlier revision's stays
within the rounds' spread. Timing two checkouts in two processes compares two moments of
a shared machine; here both run in one process: the earlier revision's `hookedattn` is
exported from git (`git archive`) into a temporary folder as a package of another name
(`hookedattn_at_<rev>`, every import renamed), both models hold the same weights, and each
round times the earlier and the current call back to back (the order alternating), so a
slow spell hits both. Reported: the median of the per-round ratios (current / earlier) with
their range, and the median times. One torch thread unless `--threads`.
"""

import argparse
import importlib
import io
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from settings import FULL  # noqa: E402

import hookedattn  # noqa: E402

MEASURES = ("forward", "run_with_cache", "generate", "return_cache")
CALLS = {"s64": 20, "a": 3, "b": 1}


def earlier_package(revision: str, into: Path) -> object:
    """The package `hookedattn` at `revision`, imported under another name."""
    blob = subprocess.run(
        ["git", "archive", "--format=tar", revision, "hookedattn"],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout  # fmt: skip
    name = "hookedattn_at_" + re.sub(r"\W", "_", revision)
    with tarfile.open(fileobj=io.BytesIO(blob)) as archive:
        archive.extractall(into, filter="data")
    (into / "hookedattn").rename(into / name)
    for path in (into / name).rglob("*.py"):
        path.write_text(re.sub(r"\bhookedattn\b", name, path.read_text()))
    sys.path.insert(0, str(into))
    return importlib.import_module(name)


def calls(package: object, model: object, tokens: torch.Tensor) -> dict[str, Callable]:
    """What each measure runs on `model`."""
    prompt = tokens[:1, :16]
    return {
        "forward": lambda: model(tokens),
        "run_with_cache": lambda: model.run_with_cache(tokens),
        "generate": lambda: model.generate(prompt, 32, stop_at_eos=False),
        "return_cache": lambda: model.generate(prompt, 32, stop_at_eos=False, return_cache=True),
    }


def interleaved(earlier: Callable, current: Callable, n: int, rounds: int) -> tuple[list, list]:
    """Each round: both calls, `n` times each, back to back, the order alternating."""

    def timed(fn: Callable) -> float:
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - start) / n

    before, after = [], []
    for r in range(rounds):
        if r % 2:
            before.append(timed(earlier))
            after.append(timed(current))
        else:
            after.append(timed(current))
            before.append(timed(earlier))
    return before, after


def main() -> None:
    """Time each setting and measure against the revision; print one line each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("revision", help="a git revision of this repository, e.g. main")
    parser.add_argument("--settings", default="s64,a", help="of the bench's settings")
    parser.add_argument("--measures", default=",".join(MEASURES), help=f"of {MEASURES}")
    parser.add_argument("--rounds", type=int, default=21)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as folder:
        old = earlier_package(args.revision, Path(folder))
        for key in args.settings.split(","):
            cfg = FULL[key].cfg
            current = hookedattn.HookedTransformer(hookedattn.HookedTransformerConfig(**cfg))
            earlier = old.HookedTransformer(old.HookedTransformerConfig(**cfg))
            earlier.load_state_dict(current.state_dict())
            generator = torch.Generator().manual_seed(0)
            shape = (FULL[key].batch, FULL[key].pos)
            tokens = torch.randint(0, cfg["d_vocab"], shape, generator=generator)
            a, b = calls(old, earlier.eval(), tokens), calls(hookedattn, current.eval(), tokens)
            for measure in args.measures.split(","):
                n = CALLS.get(key, 1) if measure in ("forward", "run_with_cache") else 1
                with torch.no_grad():
                    for _ in range(2):
                        a[measure](), b[measure]()
                    before, after = interleaved(a[measure], b[measure], n, args.rounds)
                ratios = sorted(y / x for x, y in zip(before, after, strict=True))
                print(
                    f"{key:4s} {measure:15s} this / {args.revision}: "
                    f"{statistics.median(ratios):.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f}); "
                    f"{statistics.median(before) * 1e3:.2f} ms -> "
                    f"{statistics.median(after) * 1e3:.2f} ms, {args.rounds} rounds, "
                    f"{args.threads} thread(s)",
                    flush=True,
                )


if __name__ == "__main__":
    main()
