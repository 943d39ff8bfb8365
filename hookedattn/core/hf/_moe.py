"""What the mixture-of-experts families share: the routing fields, and the rules that read a
router and its experts, from a live model or from files.

`transformers` 5 keeps a live model's experts stacked, as ours are: `mlp.experts.gate_up_proj
[expert (gate_up d_mlp) d_model]` (the gate's rows, then the up projection's) and
`mlp.experts.down_proj [expert d_model d_mlp]`, the router as `mlp.gate.weight [expert
d_model]`. `save_pretrained` writes them back in the checkpoints' own layout, which is what
a directory (a hub snapshot, or one we saved) holds: one tensor per expert and projection,
under names each family spells its own way (`ExpertFiles`). Every weight is an `nn.Linear`
`[out in]`, so each is transposed to our `[in out]`.
"""

import dataclasses
from typing import Any

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf._llama import L
from hookedattn.core.hf._table import Rule, zeros

_GATE_UP = "expert (gate_up d_mlp) d_model -> gate_up expert d_model d_mlp"
_IN, _OUT = "d_mlp d_model -> d_model d_mlp", "d_model d_mlp -> d_mlp d_model"
_DOWN = "expert d_model d_mlp -> expert d_mlp d_model"
# The dense MLP's names, which an MoE block does not have.
_DENSE_MLP = frozenset(
    f"blocks.{{layer}}.mlp.{n}" for n in ("W_gate", "W_in", "b_in", "W_out", "b_out")
)


@dataclasses.dataclass(frozen=True)
class ExpertFiles:
    """Where a family's files keep its router and each expert's three projections
    (`{expert}` is the expert's index), under `model.layers.{layer}.`."""

    router: str
    gate: str
    up: str
    down: str


def routing(num_experts: int, experts_per_token: int, norm_topk_prob: bool) -> dict[str, Any]:
    """Our routing fields."""
    return dict(
        num_experts=int(num_experts),
        experts_per_token=int(experts_per_token),
        norm_topk_prob=bool(norm_topk_prob),
    )


def without_dense_mlp(rules: list[Rule]) -> list[Rule]:
    """`rules` less the dense MLP's (a Llama-like table's), which the experts replace."""
    return [rule for rule in rules if rule.ours not in _DENSE_MLP]


def expert_rules(cfg: HookedTransformerConfig, files: ExpertFiles, live: bool) -> list[Rule]:
    """The router's and the experts' rules (unexpanded), for a live model's stacked tensors
    or, `live=False`, for a directory's per-expert files; no biases."""
    m, n = "blocks.{layer}.mlp", cfg.num_experts
    if live:
        stacked = f"{L}.mlp.experts"
        weights = [
            Rule(f"{m}.W_router", f"{L}.mlp.gate.weight", "expert d_model -> d_model expert"),
            Rule(f"{m}.W_gate", f"{stacked}.gate_up_proj", _GATE_UP, pick=0),
            Rule(f"{m}.W_in", f"{stacked}.gate_up_proj", _GATE_UP, pick=1),
            Rule(f"{m}.W_out", f"{stacked}.down_proj", _DOWN),
        ]
    else:
        weights = [
            Rule(f"{m}.W_router", f"{L}.{files.router}", "expert d_model -> d_model expert"),
            Rule(f"{m}.W_gate", f"{L}.{files.gate}", _IN, experts=n),
            Rule(f"{m}.W_in", f"{L}.{files.up}", _IN, experts=n),
            Rule(f"{m}.W_out", f"{L}.{files.down}", _OUT, experts=n),
        ]
    return [
        *weights,
        zeros(f"{m}.b_router", "expert"),
        zeros(f"{m}.b_gate", "expert d_mlp"),
        zeros(f"{m}.b_in", "expert d_mlp"),
        zeros(f"{m}.b_out", "expert d_model"),
    ]


def shared_expert_rules(gated: bool) -> list[Rule]:
    """The shared expert's rules (Qwen2-MoE: `mlp.shared_expert.*`, and the gate's row)."""
    s, hf = "blocks.{layer}.mlp.shared_expert", f"{L}.mlp.shared_expert"
    in_, out = (
        "d_mlp_shared d_model -> d_model d_mlp_shared",
        "d_model d_mlp_shared -> d_mlp_shared d_model",
    )
    rules = [
        Rule(f"{s}.W_gate", f"{hf}.gate_proj.weight", in_),
        Rule(f"{s}.W_in", f"{hf}.up_proj.weight", in_),
        zeros(f"{s}.b_in", "d_mlp_shared"),
        Rule(f"{s}.W_out", f"{hf}.down_proj.weight", out),
        zeros(f"{s}.b_out", "d_model"),
    ]
    if gated:
        gate = f"{L}.mlp.shared_expert_gate.weight"
        rules.append(Rule("blocks.{layer}.mlp.W_shared_gate", gate, "one d_model -> d_model one"))
    return rules
