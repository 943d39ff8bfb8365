"""GPT-2 (`GPT2LMHeadModel`, any size).

GPT-2 stores its linear maps as `Conv1D` weights `[in out]` (row vectors, `y = x @ W + b`,
our convention already), and fuses the query, key and value maps of all heads into one
`c_attn: [d_model (qkv head d_head)]`: converting is splitting that matrix per head.
"""

import types
from typing import Any

import torch
from torch import Tensor

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _translate
from hookedattn.core.hf._family import Family, tied_unembedding
from hookedattn.core.hf._table import Rule, StateDict, Table, check_source, convert, zeros

_H = "transformer.h.{layer}"
_RULES = (
    Rule("embed.W_E", "transformer.wte.weight", "d_vocab d_model -> d_vocab d_model"),
    Rule("pos_embed.W_pos", "transformer.wpe.weight", "n_ctx d_model -> n_ctx d_model"),
    Rule("blocks.{layer}.ln1.w", f"{_H}.ln_1.weight", "d_model -> d_model"),
    Rule("blocks.{layer}.ln1.b", f"{_H}.ln_1.bias", "d_model -> d_model"),
    *(
        Rule(
            f"blocks.{{layer}}.attn.W_{part}",
            f"{_H}.attn.c_attn.weight",
            "d_model (qkv head d_head) -> qkv head d_model d_head",
            pick=index,
        )
        for index, part in enumerate("QKV")
    ),
    *(
        Rule(
            f"blocks.{{layer}}.attn.b_{part}",
            f"{_H}.attn.c_attn.bias",
            "(qkv head d_head) -> qkv head d_head",
            pick=index,
        )
        for index, part in enumerate("QKV")
    ),
    Rule(
        "blocks.{layer}.attn.W_O",
        f"{_H}.attn.c_proj.weight",
        "(head d_head) d_model -> head d_head d_model",
    ),
    Rule("blocks.{layer}.attn.b_O", f"{_H}.attn.c_proj.bias", "d_model -> d_model"),
    Rule("blocks.{layer}.ln2.w", f"{_H}.ln_2.weight", "d_model -> d_model"),
    Rule("blocks.{layer}.ln2.b", f"{_H}.ln_2.bias", "d_model -> d_model"),
    Rule("blocks.{layer}.mlp.W_in", f"{_H}.mlp.c_fc.weight", "d_model d_mlp -> d_model d_mlp"),
    Rule("blocks.{layer}.mlp.b_in", f"{_H}.mlp.c_fc.bias", "d_mlp -> d_mlp"),
    Rule("blocks.{layer}.mlp.W_out", f"{_H}.mlp.c_proj.weight", "d_mlp d_model -> d_mlp d_model"),
    Rule("blocks.{layer}.mlp.b_out", f"{_H}.mlp.c_proj.bias", "d_model -> d_model"),
    Rule("ln_final.w", "transformer.ln_f.weight", "d_model -> d_model"),
    Rule("ln_final.b", "transformer.ln_f.bias", "d_model -> d_model"),
    Rule("unembed.W_U", "lm_head.weight", "d_vocab_out d_model -> d_model d_vocab_out"),
    zeros("unembed.b_U", "d_vocab_out"),  # GPT-2's lm_head has no bias
)
# The causal mask, which older `transformers` versions kept in the state dict.
_IGNORED = (r"\.attn\.(bias|masked_bias)$",)


def gpt2_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `transformers.GPT2Config`; variants we cannot express are
    errors."""
    if getattr(hf_config, "scale_attn_by_inverse_layer_idx", False):
        raise ValueError(
            "this GPT-2 scales attention by 1/(layer index + 1) "
            "(scale_attn_by_inverse_layer_idx=True); a HookedTransformer has one attn_scale"
        )
    if getattr(hf_config, "add_cross_attention", False):
        raise ValueError(
            "this GPT-2 has cross-attention (add_cross_attention=True): a decoder "
            "with cross-attention cannot be imported"
        )
    d_model, n_heads = hf_config.n_embd, hf_config.n_head
    d_head = d_model // n_heads
    return dict(
        n_layers=hf_config.n_layer,
        d_model=d_model,
        n_ctx=hf_config.n_positions,
        d_vocab=hf_config.vocab_size,
        n_heads=n_heads,
        d_head=d_head,
        d_mlp=hf_config.n_inner or 4 * d_model,
        act_fn=_translate.activation(hf_config.activation_function, "activation_function"),
        normalization_type="LN",
        positional_embedding_type="standard",
        eps=hf_config.layer_norm_epsilon,
        attn_scale=d_head**0.5 if hf_config.scale_attn_weights else 1.0,
    )


def gpt2_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """The GPT-2 conversion table for `cfg.n_layers` blocks."""
    return Table(
        rules=tuple(r for rule in _RULES for r in rule.expand(cfg.n_layers)),
        aliases=tied_unembedding(hf_config, "transformer.wte.weight"),
        ignored=_IGNORED,
        label="GPT-2",
        base_prefix="transformer.",
    )


def convert_gpt2_state_dict(
    state_dict: dict[str, Tensor],
    cfg: HookedTransformerConfig,
    tie_word_embeddings: bool = True,
) -> dict[str, Tensor]:
    """Our state dict for a `GPT2LMHeadModel` state dict; missing, extra or misshapen HF
    tensors are a `CheckpointError` that lists them, raised before anything is converted."""
    table = gpt2_table(types.SimpleNamespace(tie_word_embeddings=tie_word_embeddings), cfg)
    source = StateDict(state_dict)
    check_source(table, source, cfg)
    dtype = next(iter(state_dict.values())).dtype
    device = next(iter(state_dict.values())).device
    return dict(convert(table, source, cfg, dtype, device))


FAMILY = Family("GPT2LMHeadModel", "gpt2", gpt2_fields, gpt2_table)


def gpt2_config(
    hf_config: Any, dtype: torch.dtype | str = torch.float32, device: str = "cpu"
) -> HookedTransformerConfig:
    """Our config for a `transformers.GPT2Config`; variants we cannot express are errors."""
    return FAMILY.config(hf_config, dtype, device)
