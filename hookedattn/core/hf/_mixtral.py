"""Mixtral (`MixtralForCausalLM`).

Mistral's attention (grouped keys and values, a sliding window in every layer when the
config has one, no biases) with a mixture of experts for its MLP: a router without bias
chooses `num_experts_per_tok` of `num_local_experts` SwiGLU experts per token, weighted by
the softmax over all experts renormalised over the chosen ones (`norm_topk_prob`, always).
Its files keep the experts as `block_sparse_moe.experts.{e}.w1` (gate), `w3` (up) and `w2`
(down); a live model stacks them (`hookedattn.core.hf._moe`). `router_jitter_noise` acts in
training only.
"""

from typing import Any

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _moe, _translate
from hookedattn.core.hf._family import Family
from hookedattn.core.hf._llama import llama_like_rules, llama_like_table
from hookedattn.core.hf._table import Table

FILES = _moe.ExpertFiles(
    router="block_sparse_moe.gate.weight",
    gate="block_sparse_moe.experts.{expert}.w1.weight",
    up="block_sparse_moe.experts.{expert}.w3.weight",
    down="block_sparse_moe.experts.{expert}.w2.weight",
)


def mixtral_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `transformers.MixtralConfig`."""
    c = hf_config
    return _translate.llama_like(c) | _moe.routing(
        c.num_local_experts, c.num_experts_per_tok, norm_topk_prob=True
    )


def mixtral_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """Mixtral: Mistral's table with the router and experts in place of the MLP."""
    rules = [
        *_moe.without_dense_mlp(llama_like_rules(cfg)),
        *_moe.expert_rules(cfg, FILES, live=hf_model is not None),
    ]
    return llama_like_table(hf_config, cfg, rules, "Mixtral")


FAMILY = Family("MixtralForCausalLM", "mixtral", mixtral_fields, mixtral_table)
