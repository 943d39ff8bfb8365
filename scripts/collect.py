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


def main(argv: list[str] | None = None) -> int:
    """Parse the arguments, collect, and print the store (rank 0)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--names", nargs="+", required=True, help="full hook names")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--tokens", type=float, default=None, help="at most this many (2e6)")
    parser.add_argument("--text", nargs="*", type=Path, default=None, help="text files")
    parser.add_argument("--context", type=int, default=None, help="default: the model's n_ctx")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    parser.add_argument("--shard-contexts", type=int, default=None)
    parser.add_argument("--threads", type=int, default=None, help="torch threads per rank")
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
    except (KeyError, ValueError, OSError) as error:
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
