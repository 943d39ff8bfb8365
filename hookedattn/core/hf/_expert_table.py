"""A mixture of experts recognised by convention (`_experts.Experts`): its config fields
and its rules.

`routing_fields` reads how many experts there are, how many each token uses, how the
router scores them (the anatomy's candidate: softmax, sigmoid, softmax with a choice
bias, or Phi-3.5-MoE's sparsemixer with its epsilon), groups, routed scaling, a shared
expert and which layers hold the mixture; `expert_rules` reads the router, the experts
(stacked as a live model keeps them, transposed or not, or one tensor per expert and
projection as files hold them) and the shared expert, beside the block or in it, fused
or not.
"""

from collections.abc import Callable
from typing import Any

from torch import Tensor

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _experts, _moe_layers
from hookedattn.core.hf._recognised import Anatomy
from hookedattn.core.hf._table import MLP_IN, MLP_OUT, Rule, times, zeros

# The config fields that may hold the routed experts' weight multiplier (HY V3's).
_SCALES = ("routed_scaling_factor", "route_scale", "router_scaling_factor")


def routing_fields(c: Any, anatomy: Anatomy) -> dict[str, Any]:
    """A mixture's fields: how many experts, how many per token, how they are scored
    (softmax; sigmoid where the router has a choice bias) and grouped, a shared expert,
    dense first layers."""
    e = anatomy.experts
    if e is None:
        return {}
    fields = {
        "num_experts": int(getattr(c, e.count_field)),
        "experts_per_token": int(getattr(c, e.top_k_field)),
        "norm_topk_prob": anatomy.norm_topk,
        "d_mlp_shared": int(_experts.field_value(c, e.shared_width_field)) if e.shared else None,
        "shared_expert_gate": e.shared_gate is not None,
        "routed_scaling_factor": float(
            next((getattr(c, f) for f in _SCALES if getattr(c, f, None) is not None), 1.0)
        ),
    }
    if e.out_norm:
        fields["moe_out_norm"] = True
    if anatomy.norm_topk and e.renorm_eps:
        fields["norm_topk_eps"] = e.renorm_eps
    if anatomy.router_scoring == "sigmoid_on_input":  # Llama 4's
        fields["expert_input_weighted"] = True
    if anatomy.router_scoring != "softmax":
        fields |= {
            "router_scoring": anatomy.router_scoring.removesuffix("_on_input"),
            "n_expert_groups": int(getattr(c, "n_group", None) or 1),
            "topk_expert_groups": int(getattr(c, "topk_group", None) or 1),
        }
    if anatomy.router_scoring == "sparsemixer":
        fields["sparsemixer_jitter_eps"] = float(c.router_jitter_noise)
    return fields | _layer_fields(c, e)


def _layer_fields(c: Any, e: _experts.Experts) -> dict[str, Any]:
    """Which blocks hold the mixture, as the checkpoint's config says (`_moe_layers`): none
    of the fields where all do, `n_dense_layers` where the dense ones come first (as saved
    configs have always said it), `moe_layers` otherwise; and the dense MLPs' width."""
    if e.moe_field is None:
        return {}
    flags = _moe_layers.moe_layers(c, e.moe_field, int(c.num_hidden_layers))
    if all(flags):
        return {}
    if e.dense_width_field is None:
        raise ValueError(
            f"{e.moe_field} keeps dense MLPs in layers {[i for i, f in enumerate(flags) if not f]}"
            ", but the twin's layers all hold experts: no dense width to read"
        )
    first = flags.index(True) if True in flags else len(flags)
    prefix = flags == tuple(i >= first for i in range(len(flags)))
    layers = {"n_dense_layers": first} if prefix else {"moe_layers": flags}
    return layers | {"d_mlp_dense": int(getattr(c, e.dense_width_field))}


_GATE_UP = "expert (gate_up d_mlp) d_model -> gate_up expert d_model d_mlp"
_GATE_UP_T = "expert d_model (gate_up d_mlp) -> gate_up expert d_model d_mlp"
_DOWN = "expert d_model d_mlp -> expert d_mlp d_model"
_DOWN_T = "expert d_mlp d_model -> expert d_mlp d_model"


def expert_rules(
    e: Any, layer: str, cfg: HookedTransformerConfig, out_scale: float, live: bool
) -> list[Rule]:
    """The router's, the experts' and the shared expert's rules (unexpanded): stacked as a
    live model keeps them, or as the files hold them (`_experts.Experts`)."""
    m, at = "blocks.{layer}.mlp", f"{layer}"
    transposed = e.transposed if live or e.saved_transposed is None else e.saved_transposed
    gate_up, down = (_GATE_UP_T, _DOWN_T) if transposed else (_GATE_UP, _DOWN)
    out = times(out_scale)
    router = f"{e.router}.weight" if live else e.saved_router
    rules = [Rule(f"{m}.W_router", f"{at}.{router}", "expert d_model -> d_model expert")]
    if live or e.saved_stacked:
        up_name, down_name = (
            (f"{e.stacked}.gate_up_proj", f"{e.stacked}.down_proj") if live else e.saved_stacked
        )
        rules += [
            Rule(f"{m}.W_gate", f"{at}.{up_name}", gate_up, pick=0),
            Rule(f"{m}.W_in", f"{at}.{up_name}", gate_up, pick=1),
            Rule(f"{m}.W_out", f"{at}.{down_name}", down, adjust=out),
        ]
    else:
        n, (g, u, d) = cfg.num_experts, e.files
        rules += [
            Rule(f"{m}.W_gate", f"{at}.{g}", MLP_IN, experts=n),
            Rule(f"{m}.W_in", f"{at}.{u}", MLP_IN, experts=n),
            Rule(f"{m}.W_out", f"{at}.{d}", MLP_OUT, experts=n, adjust=out),
        ]
    rules += [
        zeros(f"{m}.b_router", "expert"),
        zeros(f"{m}.b_gate", "expert d_mlp"),
        zeros(f"{m}.b_in", "expert d_mlp"),
        zeros(f"{m}.b_out", "expert d_model"),
    ]
    if e.shared:
        rules += _shared_expert_rules(e, m, at, out, live)
    if e.shared_gate:
        rules.append(Rule(f"{m}.W_shared_gate", f"{at}.{e.shared_gate}.weight",
                          "one d_model -> d_model one"))  # fmt: skip
    unsaved = e.choice_bias and e.saved_choice_bias is None  # zeros, as the model starts
    biased = cfg.router_scoring in ("sigmoid", "softmax_biased")  # they hold a choice bias
    if unsaved or (biased and not e.choice_bias):
        rules.append(zeros(f"{m}.b_router_choice", "expert"))
    elif e.choice_bias:
        bias = e.choice_bias if live else e.saved_choice_bias
        rules.append(Rule(f"{m}.b_router_choice", f"{at}.{bias}", e.choice_bias_pattern))
    return rules


def _shared_expert_rules(
    e: Any, m: str, at: str, out: Callable[[Tensor], Tensor] | None, live: bool
) -> list[Rule]:
    """The shared expert's rules, under our block `m` and the layer `at`: its gate and up maps
    (fused in one `input_linear` or apart) and its down map, live or as the files hold it."""
    s, hf = f"{m}.shared_expert", f"{at}.{e.shared if live else e.saved_shared}"
    shared_in = "d_mlp_shared d_model -> d_model d_mlp_shared"
    shared_out = "d_model d_mlp_shared -> d_mlp_shared d_model"
    halves = dict(split=("d_mlp_shared", "d_mlp_shared"))
    gate, up, down = (
        (Rule(f"{s}.W_gate", f"{hf}.input_linear.weight", shared_in, **halves),
         Rule(f"{s}.W_in", f"{hf}.input_linear.weight", shared_in, **halves, part=1),
         f"{hf}.output_linear.weight")
        if e.shared_fused else
        (Rule(f"{s}.W_gate", f"{hf}.gate_proj.weight", shared_in),
         Rule(f"{s}.W_in", f"{hf}.up_proj.weight", shared_in), f"{hf}.down_proj.weight")
    )  # fmt: skip
    return [
        gate,
        up,
        zeros(f"{s}.b_in", "d_mlp_shared"),
        Rule(f"{s}.W_out", down, shared_out, adjust=out),
        zeros(f"{s}.b_out", "d_model"),
    ]
