"""Qwen2-MoE (`Qwen2MoeForCausalLM`) and Qwen3-MoE (`Qwen3MoeForCausalLM`).

Each is its dense namesake's block with a mixture of experts for its MLP: a router without
bias over `num_experts` SwiGLU experts of width `moe_intermediate_size`, the softmax over
all experts' weights of the chosen `num_experts_per_tok` renormalised when `norm_topk_prob`.

    Qwen2-MoE  q, k, v biases (`qkv_bias`); a shared expert every token uses (width
               `shared_expert_intermediate_size`), scaled by `sigmoid(x @ shared_expert_gate)`;
               windows on the layers `layer_types` names
    Qwen3-MoE  per-head q/k norms, `head_dim` of its own, biases when `attention_bias`; a
               window in every layer when `use_sliding_window`

A config that keeps dense MLPs in some layers (`mlp_only_layers`, `decoder_sparse_step`) is
refused by name. The files keep one tensor per expert (`mlp.experts.{e}.gate_proj`, ...).
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


def _qwen_moe_fields(hf_config: Any) -> dict[str, Any]:
    c = hf_config
    _moe.refuse_dense_layers(c)
    return (
        _translate.llama_like(c)
        | _moe.routing(c.num_experts, c.num_experts_per_tok, c.norm_topk_prob)
        | dict(d_mlp=c.moe_intermediate_size)
    )


def qwen2_moe_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `transformers.Qwen2MoeConfig`: a gated shared expert."""
    return _qwen_moe_fields(hf_config) | dict(
        d_mlp_shared=hf_config.shared_expert_intermediate_size, shared_expert_gate=True
    )


def qwen3_moe_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `transformers.Qwen3MoeConfig`: q/k norms per head."""
    return _qwen_moe_fields(hf_config) | dict(use_qk_norm=True, qk_norm_per_head=True)


def qwen2_moe_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """Qwen2-MoE: q/k/v biases, the router and experts, the gated shared expert."""
    bias = bool(getattr(hf_config, "qkv_bias", True))
    rules = [
        *_moe.without_dense_mlp(llama_like_rules(cfg, qkv_bias=bias)),
        *_moe.expert_rules(cfg, FILES, live=hf_model is not None),
        *_moe.shared_expert_rules(gated=True),
    ]
    return llama_like_table(hf_config, cfg, rules, "Qwen2-MoE")


def qwen3_moe_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """Qwen3-MoE: optional attention biases, per-head q/k norm gains, router and experts."""
    bias = bool(getattr(hf_config, "attention_bias", False))
    rules = [
        *_moe.without_dense_mlp(llama_like_rules(cfg, qkv_bias=bias, o_bias=bias)),
        Rule("blocks.{layer}.attn.q_norm.w", f"{L}.self_attn.q_norm.weight", "d_head -> d_head"),
        Rule("blocks.{layer}.attn.k_norm.w", f"{L}.self_attn.k_norm.weight", "d_head -> d_head"),
        *_moe.expert_rules(cfg, FILES, live=hf_model is not None),
    ]
    return llama_like_table(hf_config, cfg, rules, "Qwen3-MoE")


QWEN2_MOE = Family("Qwen2MoeForCausalLM", "qwen2_moe", qwen2_moe_fields, qwen2_moe_table)
QWEN3_MOE = Family("Qwen3MoeForCausalLM", "qwen3_moe", qwen3_moe_fields, qwen3_moe_table)
