"""The TransformerLens 4 columns of `scripts/bench`: `TransformerBridge` on our weights.

TransformerLens 4 has no `HookedTransformer` of its own: its model is a bridge around a
HuggingFace model. We boot it from the `transformers.GPT2LMHeadModel` that `hf.py`
builds with our exact weights (`hf_model=`: nothing is read from disk or the hub), with a
word-level tokenizer over our vocabulary, which the bridge insists on even for token input.
Two columns: "bridge" with `enable_compatibility_mode(no_processing=True)`, the legacy
HookedTransformer hook names and components without weight processing (folding the norms
and centering the weights would change the logits the bench checks against the bare model),
and "native", the bridge as booted. Both expose the names the bench hooks
(`blocks.{i}.hook_resid_pre/mid/post`); `scripts/bench` checks that they fire.
"""

import os
import warnings
from typing import Any

from hf import hf_gpt2
from settings import BRIDGE, NATIVE

from hookedattn import HookedTransformer


def transformer_lens_major() -> int | None:
    """The installed TransformerLens's major version, or None where it is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version("transformer_lens").split(".")[0])
    except PackageNotFoundError:
        return None


def _tokenizer(d_vocab: int) -> Any:
    """A word-level tokenizer `t0 ... t{d_vocab-1}`; its pad id is outside the vocabulary,
    so that no token of ours reads as padding."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(d_vocab)} | {"<pad>": d_vocab}
    inner = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    inner.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=inner, unk_token="t0", pad_token="<pad>")


def bridge_models(
    model: HookedTransformer, columns: tuple[str, ...] = (BRIDGE, NATIVE)
) -> dict[str, Any]:
    """`{column: TransformerBridge}` on `model`'s weights, for each of `columns`; empty
    where it cannot be built (no TransformerLens 4, or a model that is not GPT-2-shaped)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # A filter that takes every name also names the hooks gated off in this model, which the
    # bridge warns it skips; they never fire in TransformerLens 3 either.
    warnings.filterwarnings("ignore", message="run_with_hooks: skipped")
    try:
        from transformer_lens.model_bridge import TransformerBridge
    except ImportError:
        return {}
    bridges = {}
    for column in columns:
        hf = hf_gpt2(model)  # a fresh copy each: the bridge replaces its modules in place
        if hf is None:
            return {}
        bridge = TransformerBridge.boot_transformers(
            "gpt2",  # picks the GPT-2 adapter; the config and weights are hf's own
            hf_model=hf,
            tokenizer=_tokenizer(model.cfg.d_vocab),
            device=model.cfg.device,
            dtype=model.cfg.dtype,
        )
        if column == BRIDGE:
            bridge.enable_compatibility_mode(disable_warnings=True, no_processing=True)
        bridges[column] = bridge.eval()
    return bridges
