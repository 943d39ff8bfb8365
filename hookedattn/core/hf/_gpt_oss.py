"""GPT-OSS (`GptOssForCausalLM`).

Beyond Llama: biases on the query, key, value and output projections; a learned attention
sink per head (a logit every query's softmax includes, with no value: `use_attn_sinks`);
layers alternating between a sliding window and full attention (`layer_types`); YaRN
rotary frequencies, whose cosines and sines are scaled by YaRN's attention factor; and a
mixture of experts for its MLP. The router has a bias and mixes the chosen experts by the
softmax over their logits alone (the softmax over all experts renormalised over the chosen:
`norm_topk_prob`). Each expert is a clamped SwiGLU with biases (`swiglu_limit`,
`swiglu_alpha`). The experts are stacked in files as in a live model, `[expert in out]`
(row vectors, our convention), the gate and up projections interleaved column by column in
`gate_up_proj`. Quantised checkpoints (the released MXFP4 ones) are refused by name:
dequantise them first.
"""

from typing import Any

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _moe, _translate
from hookedattn.core.hf._family import Family
from hookedattn.core.hf._llama import L, llama_like_rules, llama_like_table
from hookedattn.core.hf._table import Rule, Table

_INTERLEAVED = "expert d_model (d_mlp gate_up) -> gate_up expert d_model d_mlp"
_INTERLEAVED_BIAS = "expert (d_mlp gate_up) -> gate_up expert d_mlp"


def gpt_oss_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `transformers.GptOssConfig`."""
    c = hf_config
    if getattr(c, "quantization_config", None):
        raise ValueError(
            "this GPT-OSS checkpoint is quantised (quantization_config, e.g. MXFP4 experts), "
            "which cannot be imported: load it dequantised (bfloat16) and pass that model"
        )
    return _translate.llama_like(c, yarn=True) | _moe.routing(
        c.num_local_experts, c.num_experts_per_tok, norm_topk_prob=True
    ) | dict(
        use_attn_sinks=True,
        swiglu_limit=float(c.swiglu_limit),
        swiglu_alpha=float(c.swiglu_alpha),
    )  # fmt: skip


def gpt_oss_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """GPT-OSS: Llama's attention with biases and sinks, the biased router, the experts."""
    bias = bool(getattr(hf_config, "attention_bias", True))
    m, e = "blocks.{layer}.mlp", f"{L}.mlp.experts"
    rules = [
        *_moe.without_dense_mlp(llama_like_rules(cfg, qkv_bias=bias, o_bias=bias)),
        Rule("blocks.{layer}.attn.sinks", f"{L}.self_attn.sinks", "head -> head"),
        Rule(f"{m}.W_router", f"{L}.mlp.router.weight", "expert d_model -> d_model expert"),
        Rule(f"{m}.b_router", f"{L}.mlp.router.bias", "expert -> expert"),
        Rule(f"{m}.W_gate", f"{e}.gate_up_proj", _INTERLEAVED, pick=0),
        Rule(f"{m}.W_in", f"{e}.gate_up_proj", _INTERLEAVED, pick=1),
        Rule(f"{m}.b_gate", f"{e}.gate_up_proj_bias", _INTERLEAVED_BIAS, pick=0),
        Rule(f"{m}.b_in", f"{e}.gate_up_proj_bias", _INTERLEAVED_BIAS, pick=1),
        Rule(f"{m}.W_out", f"{e}.down_proj", "expert d_mlp d_model -> expert d_mlp d_model"),
        Rule(f"{m}.b_out", f"{e}.down_proj_bias", "expert d_model -> expert d_model"),
    ]
    return llama_like_table(hf_config, cfg, rules, "GPT-OSS")


FAMILY = Family("GptOssForCausalLM", "gpt_oss", gpt_oss_fields, gpt_oss_table)
