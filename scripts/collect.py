"""Collect activations over a dataset into an activation store, on one process or many.

    python scripts/collect.py --model bytes-attn-only-2l --names blocks.1.hook_resid_pre \\
        --out acts/ --tokens 2e6
    torchrun --nproc_per_node=2 scripts/collect.py --model bytes-attn-only-2l \\
        --names blocks.1.hook_resid_pre --out acts/ --tokens 2e6    # the same files

`--model` is a shipped model's name or a folder saved with `HookedTransformer.save`.
Inputs default to the training split of the standard library's source (no download);
`--text FILE ...` packs text files instead. Rerunning the same command after a crash
finishes the store; see the README section "Dataset scale".
"""

import argparse
import math
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from hookedattn import ByteTokenizer, HookedTransformer, list_pretrained
from hookedattn.store import ActivationStore, collect_activations, init_from_env, local_device_index
from hookedattn.store.collection import DTYPES


def load_model(name_or_dir: str, device: str | None = None) -> HookedTransformer:
    """A shipped model by name, or a model saved in a folder, on `device`."""
    if Path(name_or_dir).is_dir():
        model = HookedTransformer.load(name_or_dir, device=device)
        if model.tokenizer is None and model.cfg.d_vocab == ByteTokenizer().vocab_size:
            model.tokenizer = ByteTokenizer()  # the byte vocabulary of the shipped models
        return model
    known = [info.name for info in list_pretrained()]
    if name_or_dir not in known:
        raise SystemExit(
            f"--model {name_or_dir!r} is neither a folder nor a shipped model ({', '.join(known)})"
        )
    return HookedTransformer.from_pretrained(name_or_dir, device=device)


def _positive_int(text: str) -> int:
    """argparse type: a positive int (`--batch-size`, `--shard-contexts`, `--context`)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive int, got {text!r}")
    return value


def _token_count(text: str) -> float:
    """argparse type: a positive, finite number of tokens (`2e6`)."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive, finite number, got {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, collect, and print the store (rank 0)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--names", nargs="+", required=True, help="full hook names")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--tokens", type=_token_count, default=None, help="at most this many")
    parser.add_argument("--text", nargs="*", type=Path, default=None, help="text files")
    parser.add_argument("--context", type=_positive_int, default=None, help="default: n_ctx")
    parser.add_argument("--batch-size", type=_positive_int, default=32)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--shard-contexts", type=_positive_int, default=None)
    parser.add_argument("--threads", type=_positive_int, default=None, help="threads per rank")
    parser.add_argument("--device", default=None, help="'cuda': each rank its LOCAL_RANK GPU")
    parser.add_argument("--overwrite", action="store_true")
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    ranks = init_from_env()
    device = args.device
    if device == "cuda":
        device = f"cuda:{local_device_index()}"
    model = load_model(args.model, device)
    try:
        collect_activations(
            model,
            args.text,
            names=args.names,
            out=args.out,
            context=args.context,
            n_tokens=args.tokens,
            batch_size=args.batch_size,
            dtype=DTYPES[args.dtype],
            shard_contexts=args.shard_contexts,
            overwrite=args.overwrite,
            progress=not args.no_progress,
        )
    except (KeyError, ValueError, TypeError, OSError) as error:
        print(
            f"collect.py: {error.args[0] if isinstance(error, KeyError) else error}",
            file=sys.stderr,
        )
        return 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if ranks.is_main:
        print(ActivationStore(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
