"""Phi-3 (`Phi3ForCausalLM`), and Phi-4-mini, which shares the class.

Llama's block with two fused projections: `qkv_proj` stacks the queries of all heads, then
the keys and values of each key/value group (`[(head d_head) + 2 (kv_head d_head),
d_model]`, unequal parts where keys and values are grouped), and `gate_up_proj` stacks the
MLP's gate then its up projection (`[2 d_mlp, d_model]`). Rotary positions may cover part
of each head (`partial_rotary_factor`, Phi-4-mini's 0.75); a sliding window, where the
config has one, is in every layer. "longrope" scaling (the 128k-context variants) is
refused by name.
"""

from typing import Any

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _translate
from hookedattn.core.hf._family import Family
from hookedattn.core.hf._llama import L, llama_like_rules, llama_like_table
from hookedattn.core.hf._table import Rule, Table

# Llama's names for the parts `qkv_proj` and `gate_up_proj` hold.
_SPLIT = {"q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"}


def phi3_fields(hf_config: Any) -> dict[str, Any]:
    """Our config for a `transformers.Phi3Config`."""
    fields = _translate.llama_like(hf_config)
    return fields | _translate.rotary(hf_config, fields["d_head"], partial=True)


def phi3_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """Phi-3: Llama's table with q, k, v and gate, up read from their fused tensors."""
    kv = "kv_head" if cfg.n_kv_heads != cfg.n_heads else "head"
    k_name, v_name = ("_W_K", "_W_V") if kv == "kv_head" else ("W_K", "W_V")
    qkv = ("head d_head", f"{kv} d_head", f"{kv} d_head")
    b, a, m = "blocks.{layer}", f"{L}.self_attn.qkv_proj.weight", f"{L}.mlp.gate_up_proj.weight"
    kv_in = f"({kv} d_head) d_model -> {kv} d_model d_head"
    mlp_in = "d_mlp d_model -> d_model d_mlp"
    fused = [
        Rule(f"{b}.attn.W_Q", a, "(head d_head) d_model -> head d_model d_head", split=qkv),
        Rule(f"{b}.attn.{k_name}", a, kv_in, split=qkv, part=1),
        Rule(f"{b}.attn.{v_name}", a, kv_in, split=qkv, part=2),
        Rule(f"{b}.mlp.W_gate", m, mlp_in, split=("d_mlp", "d_mlp")),
        Rule(f"{b}.mlp.W_in", m, mlp_in, split=("d_mlp", "d_mlp"), part=1),
    ]
    rules = [
        rule
        for rule in llama_like_rules(cfg)
        if rule.hf is None or rule.hf.split(".")[-2] not in _SPLIT
    ]
    return llama_like_table(hf_config, cfg, [*rules, *fused], "Phi-3")


FAMILY = Family("Phi3ForCausalLM", "phi3", phi3_fields, phi3_table)
