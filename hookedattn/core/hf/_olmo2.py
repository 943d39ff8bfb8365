"""OLMo 2 (`Olmo2ForCausalLM`).

Beyond Llama: no norm before a sublayer, one after it (`resid_mid = resid_pre +
norm(attn(resid_pre))`: the norm is part of what the sublayer writes), and the queries and
keys are RMS-normalised over the whole projection, all heads together (gains `[(head
d_head)]`, which we store as `[head d_head]`), before they are split into heads and rotated.
"""

from typing import Any

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _translate
from hookedattn.core.hf._family import Family
from hookedattn.core.hf._llama import L, llama_like_rules, llama_like_table
from hookedattn.core.hf._table import Rule, Table

NORMS = {"ln1_post": "post_attention_layernorm", "ln2_post": "post_feedforward_layernorm"}


def olmo2_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `transformers.Olmo2Config`: post-norms only, q/k norms over
    whole projections."""
    return _translate.llama_like(hf_config) | dict(
        normalization_placement="post", use_qk_norm=True, qk_norm_per_head=False
    )


def olmo2_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """OLMo 2: Llama's table with post-norms only and whole-projection q/k norm gains."""
    bias = bool(getattr(hf_config, "attention_bias", False))
    kv = "kv_head" if cfg.n_kv_heads != cfg.n_heads else "head"
    a = f"{L}.self_attn"
    rules = [
        *llama_like_rules(cfg, norms=NORMS, qkv_bias=bias, o_bias=bias),
        Rule("blocks.{layer}.attn.q_norm.w", f"{a}.q_norm.weight", "(head d_head) -> head d_head"),
        Rule("blocks.{layer}.attn.k_norm.w", f"{a}.k_norm.weight", f"({kv} d_head) -> {kv} d_head"),
    ]
    return llama_like_table(hf_config, cfg, rules, "OLMo 2")


FAMILY = Family("Olmo2ForCausalLM", "olmo2", olmo2_fields, olmo2_table)
