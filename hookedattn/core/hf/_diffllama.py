"""DiffLlama (`DiffLlamaForCausalLM`): Llama with differential attention (Ye et al. 2024;
`components.differential_attention`).

Beyond Llama: each attention holds four `head_dim` vectors `lambda_q1`, `lambda_k1`,
`lambda_q2`, `lambda_k2` (our parameters of the same names), and a gainless RMSNorm over
each pair of heads' `2 head_dim` outputs (`groupnorm`: ours `z_norm`, with the model's
`rms_norm_eps`). Its `o_proj` reads the pairs, `[d_model (pair 2 head_dim)]`: our
`W_O: [pair d_pair d_model]`. `lambda_init` is not saved: both compute it from the layer's
index by the paper's schedule.
"""

from typing import Any

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _translate
from hookedattn.core.hf._family import Family
from hookedattn.core.hf._llama import L, llama_like_rules, llama_like_table
from hookedattn.core.hf._table import Rule, Table

_LAMBDAS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


def diffllama_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `transformers.DiffLlamaConfig`."""
    if getattr(hf_config, "mlp_bias", False):
        raise ValueError(
            "mlp_bias=True cannot be imported: a gated MLP here has no bias on its gate"
        )
    return _translate.llama_like(hf_config) | dict(differential_attention=True)


def diffllama_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """Llama's rules, the output projection read by pairs of heads, and the lambdas."""
    bias = bool(getattr(hf_config, "attention_bias", False))
    b, a = "blocks.{layer}.attn", f"{L}.self_attn"
    rules = [r for r in llama_like_rules(cfg, qkv_bias=bias, o_bias=bias) if r.ours != f"{b}.W_O"]
    rules += [
        Rule(f"{b}.W_O", f"{a}.o_proj.weight", "d_model (pair d_pair) -> pair d_pair d_model"),
        *(Rule(f"{b}.{name}", f"{a}.{name}", "d_head -> d_head") for name in _LAMBDAS),
    ]
    return llama_like_table(hf_config, cfg, rules, "DiffLlama")


FAMILY = Family("DiffLlamaForCausalLM", "diffllama", diffllama_fields, diffllama_table)
