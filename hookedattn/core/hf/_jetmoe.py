"""JetMoE (`JetMoeForCausalLM`): Llama's blocks with a mixture of attention heads and a
mixture of experts.

Its attention keeps `num_local_experts` experts, each a query projection and an output
projection of `num_key_value_heads` heads, over one key/value projection they share; a
router picks `num_experts_per_tok` experts per position, weighted by the softmax of their
logits. An expert that is not picked contributes nothing, so the sublayer is ours with every
expert's heads (`n_heads = num_local_experts * num_key_value_heads`, grouped over the shared
key/value heads) and a routed gate (`attn_gate="routed"`): the heads of the experts not
picked get factor 0, the others their weight. That costs the queries and scores of every
expert, where `transformers` computes the picked ones only, and gives each expert's heads
their own hook points and circuits. The router's row of an expert is each of its heads'
gate row. The bias added after the experts is `b_O`.

The mixture of experts' experts are stacked tensors (`input_linear.weight: [expert (gate up)
d_model]`, `output_linear.weight`), its router a softmax over the chosen logits (ours: the
softmax over all, renormalised over the chosen: the same weights), and its bias, added once
after the experts, is each expert's `b_out` (the weights sum to one).
"""

from typing import Any

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _moe, _translate
from hookedattn.core.hf._family import Family, tied_unembedding
from hookedattn.core.hf._llama import L, llama_like_rules
from hookedattn.core.hf._table import Rule, Table, zeros


def jetmoe_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `transformers.JetMoeConfig` (module docstring)."""
    c = hf_config
    n_kv, experts, top_k = c.num_key_value_heads, c.num_local_experts, c.num_experts_per_tok
    return _translate.llama_like(c, act_field="activation_function") | {
        "n_heads": n_kv * experts,
        "n_key_value_heads": n_kv if experts > 1 else None,
        "attn_gate": "routed",
        "attn_gate_per_head": True,
        "attn_gate_top_k": top_k,
        **_moe.routing(experts, top_k, True),
    }


def _attention_rules() -> list[Rule]:
    """The mixture of attention heads (unexpanded): each expert's heads, kv-head major."""
    b, a = "blocks.{layer}.attn", f"{L}.self_attention"
    heads = "(kv_head group)"
    kv = ("kv_head d_head", "kv_head d_head")
    return [
        Rule(f"{b}.W_Q", f"{a}.experts.input_linear.weight",
             f"group (kv_head d_head) d_model -> {heads} d_model d_head"),
        zeros(f"{b}.b_Q", "head d_head"),
        *(Rule(f"{b}._W_{n}", f"{a}.kv_proj.weight",
               "(kv_head d_head) d_model -> kv_head d_model d_head", split=kv, part=i)
          for i, n in enumerate("KV")),
        zeros(f"{b}._b_K", "kv_head d_head"),
        zeros(f"{b}._b_V", "kv_head d_head"),
        Rule(f"{b}.W_O", f"{a}.experts.output_linear.weight",
             f"group d_model (kv_head d_head) -> {heads} d_head d_model"),
        Rule(f"{b}.b_O", f"{a}.experts.bias", "d_model -> d_model"),
        # Every head of an expert gates by the expert's router row (a repeat over kv_head).
        Rule(f"{b}.W_G", f"{a}.experts.router.layer.weight",
             f"group d_model -> {heads} d_model one"),
        zeros(f"{b}.b_G", "head one"),
    ]  # fmt: skip


def _expert_rules() -> list[Rule]:
    """The mixture of experts (unexpanded), its experts stacked in one tensor each."""
    m, hf = "blocks.{layer}.mlp", f"{L}.mlp"
    fused = "expert (gate_up d_mlp) d_model -> gate_up expert d_model d_mlp"
    return [
        Rule(f"{m}.W_router", f"{hf}.router.layer.weight", "expert d_model -> d_model expert"),
        zeros(f"{m}.b_router", "expert"),
        Rule(f"{m}.W_gate", f"{hf}.input_linear.weight", fused, pick=0),
        Rule(f"{m}.W_in", f"{hf}.input_linear.weight", fused, pick=1),
        zeros(f"{m}.b_gate", "expert d_mlp"),
        zeros(f"{m}.b_in", "expert d_mlp"),
        Rule(f"{m}.W_out", f"{hf}.output_linear.weight",
             "expert d_model d_mlp -> expert d_mlp d_model"),
        Rule(f"{m}.b_out", f"{hf}.bias", "d_model -> expert d_model"),  # a repeat over experts
    ]  # fmt: skip


def jetmoe_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """JetMoE: Llama's embedding, norms and unembedding; the two mixtures' rules."""
    shared = [r for r in llama_like_rules(cfg) if ".attn." not in r.ours and ".mlp." not in r.ours]
    rules = [*shared, *_attention_rules(), *_expert_rules()]
    return Table(
        rules=tuple(r for rule in rules for r in rule.expand(cfg.n_layers)),
        aliases=tied_unembedding(hf_config, "model.embed_tokens.weight"),
        ignored=(r"rotary_emb\.inv_freq$",),
        label="JetMoE",
        base_prefix="model.",
    )


FAMILY = Family("JetMoeForCausalLM", "jetmoe", jetmoe_fields, jetmoe_table)
