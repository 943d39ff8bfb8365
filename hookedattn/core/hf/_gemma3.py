"""Gemma 3, text only (`Gemma3ForCausalLM`, model type "gemma3_text").

Gemma 2's block (the `sqrt(d_model)` embedding, `1 + w` RMSNorm gains in float32, norms
before and after each sublayer, GeGLU, scores scaled by `query_pre_attn_scalar ** -0.5`,
the final logits' soft cap where the config sets one) with three changes: each head's
queries and keys pass through an RMSNorm over `d_head` (`1 + w` gains too) before the
rotation; the local
(sliding-window) and global layers rotate by rotaries of their own, each from its own entry
of `rope_parameters` (10k locally and 1M globally in the released models, the global one
linearly scaled in the larger ones: our `rotary_base_local` and `rotary_scaling_factor_local`);
and the layers follow `layer_types` (five local to one global). Bidirectional attention
(`use_bidirectional_attention`, the embedding variants) is refused by name; so are rotary
scalings other than "linear" on the local layers. The multimodal
`Gemma3ForConditionalGeneration` is imported as its language model, this class
(`_composite`). The attention scores are not soft-capped: `attn_logit_softcapping` is read
by HF's Gemma 3 but never applied, so it is ignored here too.
"""

from typing import Any

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _gemma2, _translate
from hookedattn.core.hf._family import Family
from hookedattn.core.hf._llama import L, llama_like_rules, llama_like_table
from hookedattn.core.hf._table import Rule, Table


def gemma3_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `transformers.Gemma3TextConfig`."""
    c = hf_config
    if getattr(c, "use_bidirectional_attention", False):
        raise ValueError("use_bidirectional_attention=True cannot be imported: causal only")
    ropes = c.rope_parameters
    fields = _translate.llama_like(c, act_field="hidden_activation", rope=ropes["full_attention"])
    if "local" in (fields.get("attn_types") or ()):
        fields |= _local_rotary(ropes["sliding_attention"])
    return fields | dict(
        attn_scale=float(c.query_pre_attn_scalar) ** 0.5,
        normalization_placement="pre_and_post",
        # HF's Gemma 3 keeps `attn_logit_softcapping` in its config but never applies it
        # (its attention is called without `softcap`): neither do we.
        output_logits_soft_cap=c.final_logit_softcapping,
        use_qk_norm=True,
        qk_norm_per_head=True,
    )


def _local_rotary(rope: dict[str, Any]) -> dict[str, Any]:
    rope_type = rope.get("rope_type", "default")
    if rope_type not in ("default", "linear"):
        raise ValueError(
            f"the local layers' rope_type {rope_type!r} cannot be imported; supported for "
            f"them: default, linear"
        )
    factor = float(rope["factor"]) if rope_type == "linear" else 1.0
    return dict(rotary_base_local=float(rope["rope_theta"]), rotary_scaling_factor_local=factor)


def gemma3_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """Gemma 3: Gemma 2's table (optional attention biases) and the q/k norm gains, `1 + w`."""
    bias = bool(getattr(hf_config, "attention_bias", False))
    normaliser = _gemma2.embedding_normaliser(hf_config, cfg.dtype, hf_model)
    a, one_plus = f"{L}.self_attn", _gemma2.one_plus
    rules = [
        *llama_like_rules(
            cfg,
            norms=_gemma2.NORMS,
            qkv_bias=bias,
            o_bias=bias,
            norm_adjust=one_plus,
            embed_adjust=_gemma2.scaled(normaliser),
        ),
        Rule("blocks.{layer}.attn.q_norm.w", f"{a}.q_norm.weight", "d_head -> d_head",
             adjust=one_plus),
        Rule("blocks.{layer}.attn.k_norm.w", f"{a}.k_norm.weight", "d_head -> d_head",
             adjust=one_plus),
    ]  # fmt: skip
    return llama_like_table(hf_config, cfg, rules, "Gemma 3")


FAMILY = Family("Gemma3ForCausalLM", "gemma3_text", gemma3_fields, gemma3_table)
