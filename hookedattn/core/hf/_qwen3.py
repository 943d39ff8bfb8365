"""Qwen3 (`Qwen3ForCausalLM`).

Beyond Qwen2: each head's queries and keys pass through an RMSNorm over `d_head` (one gain
`[d_head]` shared by all heads) before the rotation, the head width `head_dim` is its own
field (not `hidden_size / num_attention_heads`), and the biases are off unless
`attention_bias`.
"""

from typing import Any

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _translate
from hookedattn.core.hf._family import Family
from hookedattn.core.hf._llama import L, llama_like_rules, llama_like_table
from hookedattn.core.hf._table import Rule, Table


def qwen3_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `transformers.Qwen3Config`: q/k norms per head."""
    return _translate.llama_like(hf_config) | dict(use_qk_norm=True, qk_norm_per_head=True)


def qwen3_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """Qwen3: Llama's table, optional attention biases, and the per-head q/k norm gains."""
    bias = bool(getattr(hf_config, "attention_bias", False))
    rules = [
        *llama_like_rules(cfg, qkv_bias=bias, o_bias=bias),
        Rule("blocks.{layer}.attn.q_norm.w", f"{L}.self_attn.q_norm.weight", "d_head -> d_head"),
        Rule("blocks.{layer}.attn.k_norm.w", f"{L}.self_attn.k_norm.weight", "d_head -> d_head"),
    ]
    return llama_like_table(hf_config, cfg, rules, "Qwen3")


FAMILY = Family("Qwen3ForCausalLM", "qwen3", qwen3_fields, qwen3_table)
