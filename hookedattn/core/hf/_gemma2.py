"""Gemma 2 (`Gemma2ForCausalLM`).

Beyond Llama: the embedding is multiplied by `sqrt(d_model)` (rounded to the weights' dtype
first, as HF rounds it); every RMSNorm multiplies by `1 + w`, in float32; norms sit before
*and* after each sublayer (the post-norm's output is what the sublayer adds to the stream);
attention scores and final logits are soft-capped, `cap * tanh(x / cap)`; layers alternate
between a sliding window and global attention (`layer_types`); the MLP is GeGLU (tanh GELU);
scores are scaled by `query_pre_attn_scalar ** -0.5`, not by `head_dim ** -0.5`.

The two constants become weights on import, so the model is a plain RMSNorm model with
untied embeddings: `W_E` is stored already multiplied by the normaliser (so `hook_embed`
and `resid_pre` at layer 0 are HF's first hidden state), and each gain is stored as
`1 + w`, computed in float32 as HF computes it and then cast (a float64 model's in float64:
see "Float64 means float64" in the design page).
"""

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _translate
from hookedattn.core.hf._family import Family
from hookedattn.core.hf._llama import llama_like_rules, llama_like_table
from hookedattn.core.hf._table import Table

NORMS = {
    "ln1": "input_layernorm",
    "ln1_post": "post_attention_layernorm",
    "ln2": "pre_feedforward_layernorm",
    "ln2_post": "post_feedforward_layernorm",
}


def gemma2_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `transformers.Gemma2Config`."""
    c = hf_config
    if getattr(c, "use_bidirectional_attention", False):
        raise ValueError("use_bidirectional_attention=True cannot be imported: causal only")
    return _translate.llama_like(c, act_field="hidden_activation") | dict(
        attn_scale=float(c.query_pre_attn_scalar) ** 0.5,
        normalization_placement="pre_and_post",
        attn_scores_soft_cap=c.attn_logit_softcapping,
        output_logits_soft_cap=c.final_logit_softcapping,
    )


def one_plus(w: Tensor) -> Tensor:
    """Gemma's gain `1 + w`, computed in float32 as `Gemma2RMSNorm` computes it (in float64
    for a float64 model, which computes in float64 throughout)."""
    return 1.0 + (w if w.dtype == torch.float64 else w.float())


def embedding_normaliser(
    hf_config: Any,
    dtype: torch.dtype,
    hf_model: Any = None,
    width: int | None = None,
    module: Any = None,
) -> Tensor:
    """`sqrt(d_model)` as HF multiplies by it: the model's own constant when there is one;
    else as `from_pretrained` builds it, a tensor of the default dtype (float32, or float64
    for a float64 model) cast to the weights' dtype. `width` and `module`: another
    embedding's (Gemma 4's per-layer inputs: `sqrt` of their width, their module's)."""
    if module is None and hf_model is not None:
        module = hf_model.model.embed_tokens
    if module is not None:
        return module.embed_scale.to(dtype)
    built = torch.float64 if dtype == torch.float64 else torch.float32
    width = hf_config.hidden_size if width is None else width
    return torch.tensor(width**0.5, dtype=built).to(dtype)


def scaled(normaliser: Tensor) -> Callable[[Tensor], Tensor]:
    """The adjustment that multiplies `W_E` by the embedding's normaliser (Gemma 2, 3)."""

    def scale(W_E: Tensor) -> Tensor:
        return W_E * normaliser.to(W_E.device)

    return scale


def gemma2_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """Gemma 2: Llama's table with four norms per block, `1 + w` gains, a scaled `W_E`."""
    rules = llama_like_rules(
        cfg,
        norms=NORMS,
        norm_adjust=one_plus,
        embed_adjust=scaled(embedding_normaliser(hf_config, cfg.dtype, hf_model)),
    )
    return llama_like_table(hf_config, cfg, rules, "Gemma 2")


FAMILY = Family("Gemma2ForCausalLM", "gemma2", gemma2_fields, gemma2_table)
