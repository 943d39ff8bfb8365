"""OLMo 2 (`Olmo2ForCausalLM`).

Beyond Llama: no norm before a sublayer, one after it (`resid_mid = resid_pre +
norm(attn(resid_pre))`: the norm is part of what the sublayer writes), and the queries and
keys are RMS-normalised over the whole projection, all heads together (gains `[(head
d_head)]`, which we store as `[head d_head]`), before they are split into heads and rotated.
"""

from typing import Any

import torch

from hookedattn.config import HookedTransformerConfig
from hookedattn.hf import translate
from hookedattn.hf.family import Family
from hookedattn.hf.llama import L, llama_like_rules, llama_like_table
from hookedattn.hf.table import Rule, Table

NORMS = {"ln1_post": "post_attention_layernorm", "ln2_post": "post_feedforward_layernorm"}


def olmo2_config(
    hf_config: Any, dtype: torch.dtype | str = torch.float32, device: str = "cpu"
) -> HookedTransformerConfig:
    """Our config for a `transformers.Olmo2Config`."""
    return HookedTransformerConfig(
        **translate.llama_like(hf_config),
        normalization_placement="post",
        use_qk_norm=True,
        qk_norm_per_head=False,
        dtype=dtype,
        device=device,
        model_name=translate.model_name(hf_config),
        original_architecture="Olmo2ForCausalLM",
    )


def olmo2_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """OLMo 2: Llama's table with post-norms only and whole-projection q/k norm gains."""
    bias = bool(getattr(hf_config, "attention_bias", False))
    kv = "kv_head" if cfg.n_key_value_heads is not None else "head"
    a = f"{L}.self_attn"
    rules = [
        *llama_like_rules(cfg, norms=NORMS, qkv_bias=bias, o_bias=bias),
        Rule("blocks.{layer}.attn.q_norm.w", f"{a}.q_norm.weight", "(head d_head) -> head d_head"),
        Rule("blocks.{layer}.attn.k_norm.w", f"{a}.k_norm.weight", f"({kv} d_head) -> {kv} d_head"),
    ]
    return llama_like_table(hf_config, cfg, rules, "OLMo 2")


FAMILY = Family("Olmo2ForCausalLM", "olmo2", olmo2_config, olmo2_table)
