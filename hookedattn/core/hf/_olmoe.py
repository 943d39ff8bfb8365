"""OLMoE (`OlmoeForCausalLM`).

Llama's pre-norm block with OLMo 2's query and key norms (an RMSNorm over the whole
projection, all heads together, before the split into heads and the rotation) and a mixture
of experts for its MLP: many small SwiGLU experts (64 in the released model, 8 per token), a
router without bias, the chosen softmax weights renormalised when `norm_topk_prob`.
`clip_qkv` (clamping the projections) is refused by name; so is a `head_dim` other than
`hidden_size / num_attention_heads` (HF sizes the key norm by the latter).
"""

from typing import Any

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _moe, _translate
from hookedattn.core.hf._family import Family
from hookedattn.core.hf._llama import L, llama_like_rules, llama_like_table
from hookedattn.core.hf._table import Rule, Table

FILES = _moe.ExpertFiles(
    router="mlp.gate.weight",
    gate="mlp.experts.{expert}.gate_proj.weight",
    up="mlp.experts.{expert}.up_proj.weight",
    down="mlp.experts.{expert}.down_proj.weight",
)


def olmoe_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `transformers.OlmoeConfig`."""
    c = hf_config
    if getattr(c, "clip_qkv", None) is not None:
        raise ValueError(
            f"clip_qkv={c.clip_qkv} clamps the query, key and value projections, which "
            f"cannot be imported: give clip_qkv=None"
        )
    fields = _translate.llama_like(c)
    if fields["d_head"] * c.num_attention_heads != c.hidden_size:
        raise ValueError(
            f"head_dim={fields['d_head']} differs from hidden_size / num_attention_heads, "
            f"which OLMoE's key norm is sized by: cannot be imported"
        )
    return (
        fields
        | _moe.routing(c.num_experts, c.num_experts_per_tok, c.norm_topk_prob)
        | dict(use_qk_norm=True, qk_norm_per_head=False)
    )


def olmoe_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """OLMoE: Llama's attention with whole-projection q/k norm gains, router and experts."""
    bias = bool(getattr(hf_config, "attention_bias", False))
    kv = "kv_head" if cfg.n_kv_heads != cfg.n_heads else "head"
    a = f"{L}.self_attn"
    rules = [
        *_moe.without_dense_mlp(llama_like_rules(cfg, qkv_bias=bias, o_bias=bias)),
        Rule("blocks.{layer}.attn.q_norm.w", f"{a}.q_norm.weight", "(head d_head) -> head d_head"),
        Rule("blocks.{layer}.attn.k_norm.w", f"{a}.k_norm.weight", f"({kv} d_head) -> {kv} d_head"),
        *_moe.expert_rules(cfg, FILES, live=hf_model is not None),
    ]
    return llama_like_table(hf_config, cfg, rules, "OLMoE")


FAMILY = Family("OlmoeForCausalLM", "olmoe", olmoe_fields, olmoe_table)
