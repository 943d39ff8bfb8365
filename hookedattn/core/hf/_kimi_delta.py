"""A hybrid checkpoint's Kimi Delta Attention layers (`components.kimi_delta`: Kimi Linear's,
Bailing Hybrid's): recognised by their parts on the tiny twin (`_mixers` asks), their
settings found among the config's fields, and their weight table.

    parts       `q_proj`, `k_proj`, `v_proj`, one depthwise `conv1d` over `[q; k; v]`, a
                `forget_gate` holding the decay's low-rank maps `f_a_proj`, `f_b_proj` and
                its `dt_bias`, `A_log` (`[1 1 head 1]`); `b_proj` (beta), the output gate's
                low-rank maps `g_a_proj`, `g_b_proj`, the gated norm `o_norm` and `o_proj`
                (Kimi Linear); or the gates' full maps, `forget_gate.f_proj` and `g_proj`,
                `A_log` one per head (Bailing Hybrid: `kda_full_rank_gates`)
    settings    the convolution's width, the heads, their width, the low-rank maps' width
                (`f_a_proj`'s outputs), the gated norm's epsilon, and Bailing Hybrid's bound
                on the decay (`kda_lower_bound`, where its `safe_gate` is on)

Kimi Linear names this layer `self_attn`, as it names its latent attention: the anatomy
tells the two apart by their parts (`_anatomy`), not by name. Its files keep the
convolution as `q_conv1d`, `k_conv1d`, `v_conv1d` and the gate's tensors on the layer
itself (`_saved` finds both on the twin). The convolution's activation is the config's
`hidden_act` in `transformers`; ours is SiLU, so another is refused by name.
"""

from typing import Any

from torch import nn

from hookedattn.core.hf._probes import CONFIG_EPSILONS
from hookedattn.core.hf._table import Rule, zeros

_SHARED = {"q_proj", "k_proj", "v_proj", "conv1d", "forget_gate", "b_proj", "o_norm", "o_proj"}
# Whether the gates are full maps -> the layer's other parts, and its forget gate's.
_FORMS = {False: ({"g_a_proj", "g_b_proj"}, {"f_a_proj", "f_b_proj"}),
          True: ({"g_proj"}, {"f_proj"})}  # fmt: skip
_GATE_OWN = {"A_log", "dt_bias"}
# Our setting -> the config fields that may hold it (the linear attention's own).
_FIELDS = {
    "d_conv": ("linear_conv_kernel_dim", "short_conv_kernel_size"),
    "n_ssm_heads": ("linear_num_heads",),
    "d_ssm_head": ("linear_head_dim",),
    "dt_rank": ("linear_head_dim",),
    "ssm_norm_eps": CONFIG_EPSILONS,
    "kda_decay_bound": ("kda_lower_bound",),
}


def form_of(module: nn.Module) -> bool | None:
    """Whether `module` is Kimi Delta Attention with full-rank gates (True, Bailing
    Hybrid's) or low-rank ones (False, Kimi Linear's); None where it is not one."""
    parts = {n for n, _ in module.named_children()}
    gate = getattr(module, "forget_gate", None)
    if gate is None or {n for n, _ in module.named_parameters(recurse=False)}:
        return None
    own = {n for n, _ in gate.named_parameters(recurse=False)}
    gate_parts = {n for n, _ in gate.named_children()}
    for full, (others, gate_maps) in _FORMS.items():
        if parts == _SHARED | others and gate_parts == gate_maps and own == _GATE_OWN:
            return full
    return None


def is_kimi_delta(module: nn.Module) -> bool:
    """Whether `module` has exactly the parts of Kimi Delta Attention (module docstring)."""
    return form_of(module) is not None


def read(module: nn.Module, config: Any) -> tuple[tuple[tuple[str, str], ...], tuple]:
    """Each setting's config field (the one that holds what the twin's module shows), and the
    biases' flags (none: a bias anywhere is refused)."""
    activation = getattr(module, "activation", "silu")
    if activation != "silu":
        raise ValueError(
            f"Kimi Delta Attention whose convolution's activation is {activation!r}: ours is 'silu'"
        )
    linears = [m for m in module.modules() if isinstance(m, nn.Linear | nn.Conv1d)]
    if any(m.bias is not None for m in linears):
        raise ValueError(
            "Kimi Delta Attention with biases: not recognised (Kimi Linear's has none)"
        )
    full = bool(form_of(module))
    shown = dict(
        d_conv=module.conv1d.kernel_size[0], n_ssm_heads=module.b_proj.out_features,
        d_ssm_head=module.o_norm.weight.shape[0],
        ssm_norm_eps=float(module.o_norm.variance_epsilon),
    )  # fmt: skip
    if full and getattr(module.forget_gate, "safe_gate", False):
        shown["kda_decay_bound"] = module.forget_gate.lower_bound
    if not full:
        shown["dt_rank"] = module.forget_gate.f_a_proj.out_features
        if module.g_a_proj.out_features != shown["dt_rank"]:
            raise ValueError(
                f"Kimi Delta Attention whose output gate's rank {module.g_a_proj.out_features} "
                f"differs from its decay's {shown['dt_rank']}: ours shares one dt_rank"
            )
    settings = []
    for ours, value in shown.items():
        field = next((f for f in _FIELDS[ours] if getattr(config, f, None) == value), None)
        if field is None:
            raise ValueError(
                f"no config field holds Kimi Delta Attention's {ours}={value} (looked at "
                f"{_FIELDS[ours]})"
            )
        settings.append((ours, field))
    flags = (("conv_bias", False), ("proj_bias", False), ("kda_full_rank_gates", full))
    return tuple(settings), flags


# Our input map -> the HF map and its width: both forms' q, k, v and beta, then Kimi
# Linear's low-rank gates' first halves, or Bailing Hybrid's whole gates.
_INPUTS = {"q": ("q_proj", "d_inner"), "k": ("k_proj", "d_inner"), "v": ("v_proj", "d_inner"),
           "b": ("b_proj", "ssm_head")}  # fmt: skip
_GATES = {False: {"f_down": ("forget_gate.f_a_proj", "dt_rank"), "g_down": ("g_a_proj", "dt_rank")},
          True: {"f": ("forget_gate.f_proj", "d_inner"), "g": ("g_proj", "d_inner")}}  # fmt: skip


def rules(at: str, ours: str, full: bool) -> list[Rule]:
    """The weight table of one Kimi Delta Attention layer at `at` (HF) and `ours`, its gates
    full maps (`full`, Bailing Hybrid's) or low-rank pairs."""
    gate = f"{at}.forget_gate"
    upper = [
        Rule(f"{ours}.W_f_up", f"{gate}.f_b_proj.weight", "d_inner dt_rank -> dt_rank d_inner"),
        Rule(f"{ours}.W_g_up", f"{at}.g_b_proj.weight", "d_inner dt_rank -> dt_rank d_inner"),
    ]
    A_log = ("ssm_head -> ssm_head" if full
             else "at_batch at_pos ssm_head one -> (at_batch at_pos ssm_head one)")  # fmt: skip
    return [
        *(r for n, (hf, width) in (_INPUTS | _GATES[full]).items() for r in (
            Rule(f"{ours}.W_{n}", f"{at}.{hf}.weight", f"{width} d_model -> d_model {width}"),
            zeros(f"{ours}.b_{n}", width))),
        *(() if full else upper),
        Rule(f"{ours}.W_conv", f"{at}.conv1d.weight",
             "(qkv d_inner) one d_conv -> (qkv d_inner) (one d_conv)"),
        zeros(f"{ours}.b_conv", "(qkv d_inner)"),
        Rule(f"{ours}.dt_bias", f"{gate}.dt_bias", "d_inner -> d_inner"),
        Rule(f"{ours}.A_log", f"{gate}.A_log", A_log),
        Rule(f"{ours}.w_norm", f"{at}.o_norm.weight", "d_ssm_head -> d_ssm_head"),
        Rule(f"{ours}.W_out", f"{at}.o_proj.weight", "d_model d_inner -> d_inner d_model"),
        zeros(f"{ours}.b_out", "d_model"),
    ]  # fmt: skip
