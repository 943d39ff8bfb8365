"""Inspect the shipped models from the shell: `python -m hookedattn COMMAND`.

    python -m hookedattn list                                   the shipped models
    python -m hookedattn predict bytes-attn-only-2l "def f(self):" -k 5   top next-token predictions
    python -m hookedattn cache bytes-attn-only-2l "import os"             every activation's shape
    python -m hookedattn cache bytes-attn-only-2l "import os" pattern 1   one activation's values
    python -m hookedattn view bytes-attn-only-2l "abcabc xyzxyz" -o attention.html
                                                          an interactive attention page

MODEL is anything `HookedTransformer.from_pretrained` takes: a shipped name (see `list`), a
folder (written by `HookedTransformer.save`, `scripts/train.py` or transformers'
`save_pretrained`), a hub repo id (`EleutherAI/pythia-70m`, fetched into the Hugging Face
cache; `--revision` picks a branch, tag or commit; `HF_HUB_OFFLINE=1` reads the cache only)
or a TransformerLens name (`gpt2-small`). `--checkpoint STEP` picks a training checkpoint
(a shipped model's, Pythia's, a TransformerLens toy model's). Activation names are full
hook names or shorthand (`pattern 1` is `blocks.1.attn.hook_pattern`), as
`ActivationCache` takes them.
"""

import argparse
import os
import sys
from typing import Any

import torch

from hookedattn.core import list_pretrained
from hookedattn.core.model import HookedTransformer
from hookedattn.core.names import expand_key
from hookedattn.core.tokenizers import ByteTokenizer
from hookedattn.viewer import attention
from hookedattn.viewer.attention import MAX_VALUES


def _load(args: argparse.Namespace) -> HookedTransformer:
    loaded = HookedTransformer.from_pretrained(
        args.model, checkpoint_value=args.checkpoint, revision=args.revision
    )
    # A folder of ours saved without a tokenizer: the byte tokenizer, where it fits.
    if loaded.tokenizer is None and loaded.cfg.d_vocab >= ByteTokenizer().vocab_size:
        loaded.tokenizer = ByteTokenizer()
    if loaded.tokenizer is None:
        raise ValueError(f"{args.model} has no tokenizer, so it cannot read a text prompt")
    return loaded


def cmd_list(args: argparse.Namespace) -> None:
    """Print each shipped model with its shape, checkpoints and training command."""
    for info in list_pretrained():
        print(repr(info))
        print(f"    {info.description}")
        print(f"    checkpoints at steps {', '.join(map(str, info.checkpoints))}")
        print(f"    reproduce: {info.training.get('command', '?')} --ship")


def cmd_predict(args: argparse.Namespace) -> None:
    """Print the prompt's tokens and the top-k next tokens with their probabilities."""
    model = _load(args)
    tokens = model.to_tokens(args.prompt)
    with torch.no_grad():
        logits = model(tokens)[0, -1]
    probs = logits.double().softmax(-1)
    top = probs.topk(min(args.k, probs.numel()))
    print(f"{args.model}: {tokens.shape[1]} tokens {model.to_str_tokens(tokens[0])}")
    print(f"top {len(top.values)} next tokens:")
    for rank, (p, token) in enumerate(zip(top.values, top.indices, strict=True), start=1):
        shown = repr(model.to_str_tokens([int(token)])[0])
        logit = float(logits[token])
        print(f"  {rank:>2}. {shown:<8} id {int(token):>3}  p = {float(p):.4f}  logit {logit:+.3f}")


def cmd_cache(args: argparse.Namespace) -> None:
    """Print the cache summary, or one activation's shape and values."""
    model = _load(args)
    with torch.no_grad():
        _, cache = model.run_with_cache(args.prompt, return_type=None)
    if args.name is None:
        print(repr(cache))
        return
    key = _cache_key(args.name, args.layer, args.sublayer)
    value = cache[key]
    full_name = expand_key(key, model.cfg.n_layers)
    torch.set_printoptions(precision=args.precision, linewidth=120, sci_mode=False)
    print(f"{full_name}: shape {list(value.shape)}, dtype {value.dtype}")
    print(value[0] if args.squeeze and value.shape[0] == 1 else value)


def cmd_view(args: argparse.Namespace) -> None:
    """Write the prompt's attention patterns, every head, as a self-contained HTML page."""
    model = _load(args)
    page = attention(model, args.prompt, head=args.head, max_values=args.max_values)
    path = page.save(args.output)
    n_tokens, n_layers = len(page.data["tokens"]), len(page.data["layers"])
    print(
        f"wrote {path} ({path.stat().st_size / 1024:.0f} KB): {n_tokens} tokens, "
        f"{n_layers} layers x {page.data['n_heads']} heads; open it in a browser"
    )


def _cache_key(name: str, layer: int | None, sublayer: str | None) -> str | tuple:
    parts: list = [name]
    if layer is not None:
        parts.append(layer)
    if sublayer is not None:
        parts.append(sublayer)
    return parts[0] if len(parts) == 1 else tuple(parts)


def _bounded_int(low: int, high: int | None = None) -> Any:
    """An argparse type: an int in `low..high` (no upper bound when None)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < low or (high is not None and value > high):
            bounds = f"{low}..{high}" if high is not None else f">= {low}"
            raise argparse.ArgumentTypeError(f"must be an int {bounds}, got {text!r}")
        return value

    return parse


# Digits after the decimal point: float64 holds 17 significant digits; torch's printer
# builds every number at the precision asked for, so an unbounded one allocates unbounded.
MAX_PRECISION = 20


def parser() -> argparse.ArgumentParser:
    """The command line of `python -m hookedattn`."""
    top = argparse.ArgumentParser(prog="python -m hookedattn", description=__doc__.split("\n\n")[0])
    commands = top.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="list the shipped models").set_defaults(run=cmd_list)
    predict = commands.add_parser("predict", help="top next-token predictions for a prompt")
    cache = commands.add_parser("cache", help="cache summary, or one activation, for a prompt")
    for sub in (predict, cache):
        _model_arguments(sub)
    predict.add_argument(
        "-k", type=_bounded_int(1), default=10, help="how many predictions (default 10)"
    )
    predict.set_defaults(run=cmd_predict)
    cache.add_argument("name", nargs="?", help="hook name or shorthand, e.g. pattern")
    cache.add_argument("layer", nargs="?", type=int)
    cache.add_argument("sublayer", nargs="?", help="e.g. ln2 for `scale 1 ln2`")
    cache.add_argument(
        "--precision",
        type=_bounded_int(0, MAX_PRECISION),
        default=3,
        help=f"digits after the point, 0..{MAX_PRECISION} (default 3)",
    )
    cache.add_argument("--squeeze", action="store_true", help="drop a batch axis of size 1")
    cache.set_defaults(run=cmd_cache)
    view = commands.add_parser("view", help="write a prompt's attention patterns as an HTML page")
    _model_arguments(view)
    view.add_argument("-o", "--output", default="attention.html", help="default attention.html")
    view.add_argument("--head", help="the head shown first, e.g. L1H4, or all (default L0H0)")
    view.add_argument(
        "--max-values",
        type=_bounded_int(1),
        default=MAX_VALUES,
        help=f"refuse pages of more pattern values than this (default {MAX_VALUES:,})",
    )
    view.set_defaults(run=cmd_view)
    return top


def _model_arguments(sub: argparse.ArgumentParser) -> None:
    sub.add_argument(
        "model",
        help="a shipped model, a folder (ours or save_pretrained's), a hub repo id "
        "(ORG/NAME) or a TransformerLens name (gpt2-small)",
    )
    sub.add_argument("prompt")
    sub.add_argument(
        "--checkpoint",
        type=int,
        metavar="STEP",
        help="a training checkpoint by its step: a shipped model's (`list` shows them), "
        "Pythia's, or a TransformerLens toy model's",
    )
    sub.add_argument(
        "--revision", help="a hub repo's branch, tag or commit (default: its main branch)"
    )


def main(argv: list[str] | None = None) -> int:
    """Run one command; errors (unknown model or name, bad prompt) print and return 2."""
    args = parser().parse_args(argv)
    try:
        args.run(args)
    except BrokenPipeError:  # the reader stopped early (`| head`): not an error
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 (Python's documented remedy)
        return 0
    except (KeyError, ValueError, TypeError, OSError, MemoryError) as error:
        # OSError: an output path that is a folder, unwritable, or under /proc; a model
        # folder that cannot be read. MemoryError: an input too large for this machine.
        message = error.args[0] if isinstance(error, KeyError) and error.args else error
        if isinstance(error, OSError) and error.strerror and error.filename is None:
            message = error.strerror  # ours name the path already, without "[Errno n]"
        print(f"error: {message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
