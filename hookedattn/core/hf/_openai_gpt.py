"""GPT-1 (`OpenAIGPTLMHeadModel`): GPT-2's sublayers behind the original Transformer's
post-residual norms.

    resid_mid  = ln_1(resid_pre + attn(resid_pre))      (our ln_resid_mid)
    resid_post = ln_2(resid_mid + mlp(resid_mid))       (our ln_resid_post)

Written out rather than derived by convention for what its modules do not show: its maps
are `Conv1D` weights `[in out]` as GPT-2's (the same rules read them), its attention keeps
its softmax scale as a flag (`scale=True`: `1 / sqrt(d_head)`) rather than a number, and
its MLP is `4 d_model` wide whatever the config says. There is no final norm: the last
block's `ln_2` is it. `afn="gelu"` is the tanh approximation (`gelu_new`).
"""

from typing import Any

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf._family import Family, tied_unembedding
from hookedattn.core.hf._gpt2 import _RULES as _GPT2_RULES
from hookedattn.core.hf._table import Rule, Table, zeros

_H = "transformer.h.{layer}"
# GPT-1's `afn` -> our act_fn (`transformers`' ACT_FNS for this model).
_ACTIVATIONS = {"gelu": "gelu_new", "relu": "relu", "silu": "silu", "swish": "silu"}
_RULES = (
    Rule("embed.W_E", "transformer.tokens_embed.weight", "d_vocab d_model -> d_vocab d_model"),
    Rule("pos_embed.W_pos", "transformer.positions_embed.weight", "n_ctx d_model -> n_ctx d_model"),
    # The attention and the MLP are GPT-2's, tensor for tensor.
    *(rule for rule in _GPT2_RULES if rule.ours.startswith(("blocks.{layer}.attn.",
                                                            "blocks.{layer}.mlp."))),
    Rule("blocks.{layer}.ln_resid_mid.w", f"{_H}.ln_1.weight", "d_model -> d_model"),
    Rule("blocks.{layer}.ln_resid_mid.b", f"{_H}.ln_1.bias", "d_model -> d_model"),
    Rule("blocks.{layer}.ln_resid_post.w", f"{_H}.ln_2.weight", "d_model -> d_model"),
    Rule("blocks.{layer}.ln_resid_post.b", f"{_H}.ln_2.bias", "d_model -> d_model"),
    Rule("unembed.W_U", "lm_head.weight", "d_vocab_out d_model -> d_model d_vocab_out"),
    zeros("unembed.b_U", "d_vocab_out"),
)  # fmt: skip


def openai_gpt_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `transformers.OpenAIGPTConfig`."""
    afn = hf_config.afn
    if afn not in _ACTIVATIONS:
        raise ValueError(f"afn={afn!r}: GPT-1's activations are {sorted(_ACTIVATIONS)}")
    return dict(
        n_layers=hf_config.n_layer,
        d_model=hf_config.n_embd,
        n_ctx=hf_config.n_positions,
        d_vocab=hf_config.vocab_size,
        n_heads=hf_config.n_head,
        d_mlp=4 * hf_config.n_embd,
        act_fn=_ACTIVATIONS[afn],
        normalization_type="LN",
        normalization_placement="post_residual",
        positional_embedding_type="standard",
        eps=hf_config.layer_norm_epsilon,
    )


def openai_gpt_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """The GPT-1 conversion table for `cfg.n_layers` blocks."""
    return Table(
        rules=tuple(r for rule in _RULES for r in rule.expand(cfg.n_layers)),
        aliases=tied_unembedding(hf_config, "transformer.tokens_embed.weight"),
        ignored=(r"\.attn\.bias$", r"\.position_ids$"),  # the causal mask, the positions
        label="GPT-1",
        base_prefix="transformer.",
    )


FAMILY = Family("OpenAIGPTLMHeadModel", "openai-gpt", openai_gpt_fields, openai_gpt_table)
