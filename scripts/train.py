"""Train one of the shipped models from its recipe, resumably, and optionally ship it.

    python scripts/train.py --preset bytes-attn-only-2l --ship

trains `bytes-attn-only-2l` (see `hookedattn/training/presets.py`) on the standard library's
own source (`hookedattn/training/corpus.py`), writing checkpoints to
`runs/bytes-attn-only-2l/`; `--ship` then copies
the final model and the recipe's chosen checkpoints into `hookedattn/pretrained/`. Run the
same command again after an interruption (Ctrl-C, a kill) and it resumes from the newest
checkpoint. `--set FIELD=VALUE` overrides a field of the model config or the TrainConfig
(for a quick trial: `--set steps=20 --set d_model=16`). Use `--threads` to fix the thread
count: results are bit-for-bit reproducible for a given thread count on a given CPU. The
default is one thread: these models are too small for a second one to pay, and on a busy
machine threads that wait for each other spin instead of computing.
"""

import argparse
import dataclasses
import json
import shlex
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from hookedattn import HookedTransformer
from hookedattn.core import _weights_io
from hookedattn.core._pretrained import write_index
from hookedattn.training import (
    PRESETS,
    Preset,
    TrainConfig,
    checkpoint_dir,
    load_stdlib_corpus,
    train,
)

REPO = Path(__file__).resolve().parent.parent
SHIP_DIR = REPO / "hookedattn" / "pretrained"


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line; `--preset` is required."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", required=True, choices=sorted(PRESETS))
    parser.add_argument("--out", type=Path, help="run directory (default runs/PRESET)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE")
    parser.add_argument("--ship", action="store_true", help="copy the result into the package")
    parser.add_argument("--ship-dir", type=Path, default=SHIP_DIR)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--corpus-root", type=Path, help="default: the stdlib of this Python")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser.parse_args(argv)


def apply_overrides(preset: Preset, assignments: list[str]) -> Preset:
    """The preset with `FIELD=VALUE` overrides applied to its model or train config."""
    model_fields = {f.name for f in dataclasses.fields(preset.model)}
    train_fields = {f.name for f in dataclasses.fields(TrainConfig)}
    model_changes: dict[str, Any] = {}
    train_changes: dict[str, Any] = {}
    for assignment in assignments:
        field, sep, text = assignment.partition("=")
        if not sep:
            raise SystemExit(f"--set expects FIELD=VALUE, got {assignment!r}")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        if field in train_fields:
            train_changes[field] = value
        elif field in model_fields:
            model_changes[field] = value
        else:
            known = ", ".join(sorted(train_fields | model_fields))
            raise SystemExit(f"--set: unknown field {field!r}; fields are {known}")
    return dataclasses.replace(
        preset,
        model=preset.model.replace(**model_changes),
        train=dataclasses.replace(preset.train, **train_changes),
    )


def ship(preset: Preset, run_dir: Path, ship_dir: Path, final_step: int) -> Path:
    """Copy the final model and the preset's checkpoints (weights and config only)."""
    target = ship_dir / preset.name
    if target.exists():
        shutil.rmtree(target)
    _copy_model(checkpoint_dir(run_dir, final_step), target)
    for step in preset.shipped_checkpoints:
        if step < final_step:
            _copy_model(checkpoint_dir(run_dir, step), target / "checkpoints" / f"step-{step:06d}")
    write_index(ship_dir)
    return target


def _copy_model(source: Path, target: Path) -> None:
    if not (source / _weights_io.CONFIG_FILE).is_file():
        raise SystemExit(
            f"no checkpoint at {source}: is the preset's checkpoint_every a divisor of its "
            f"shipped_checkpoints?"
        )
    target.mkdir(parents=True)
    for name in (_weights_io.CONFIG_FILE, _weights_io.WEIGHTS_FILE):
        shutil.copyfile(source / name, target / name)


def main(argv: list[str] | None = None) -> int:
    """Train (or resume) the preset; returns the exit status."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(args.threads)
    preset = apply_overrides(PRESETS[args.preset], args.set)
    run_dir = args.out or REPO / "runs" / preset.name
    corpus = load_stdlib_corpus(args.corpus_root)
    print(f"{preset!r}\n{corpus!r}\nrun directory: {run_dir}", file=sys.stderr)
    command = "python scripts/train.py " + shlex.join(
        ["--preset", args.preset, *(a for s in args.set for a in ("--set", s))]
    )
    metadata = {
        "preset": preset.name,
        "description": preset.description,
        "command": command,
        "threads": args.threads,
        "torch_version": torch.__version__,
        "corpus": corpus.manifest.summary(),
    }
    model = HookedTransformer(preset.model)
    started = time.perf_counter()
    try:
        result = train(
            model, corpus, preset.train, run_dir, metadata=metadata, progress=not args.quiet
        )
    except KeyboardInterrupt:
        print(
            f"\ninterrupted: run the same command again to resume from {run_dir}", file=sys.stderr
        )
        return 130
    print(f"{result!r}\nwall time in this process: {time.perf_counter() - started:.0f} s")
    print(f"checkpoints: {run_dir / 'checkpoints'}")
    if args.ship:
        print(f"shipped to {ship(preset, run_dir, args.ship_dir, result.step)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
