"""A hybrid checkpoint's Kimi Delta Attention layers (`components.kimi_delta`, Kimi Linear's):
recognised by their parts on the tiny twin (`_mixers` asks), their settings found among the
config's fields, and their weight table.

    parts       `q_proj`, `k_proj`, `v_proj`, one depthwise `conv1d` over `[q; k; v]`, a
                `forget_gate` holding the decay's low-rank maps `f_a_proj`, `f_b_proj` and
                its `dt_bias`, `A_log`; `b_proj` (beta), the output gate's low-rank maps
                `g_a_proj`, `g_b_proj`, the gated norm `o_norm` and `o_proj`
    settings    the convolution's width, the heads, their width, the low-rank maps' width
                (`f_a_proj`'s outputs) and the gated norm's epsilon

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

_PARTS = {"q_proj", "k_proj", "v_proj", "conv1d", "forget_gate", "b_proj", "g_a_proj",
          "g_b_proj", "o_norm", "o_proj"}  # fmt: skip
_GATE_PARTS, _GATE_OWN = {"f_a_proj", "f_b_proj"}, {"A_log", "dt_bias"}
# Our setting -> the config fields that may hold it (the linear attention's own).
_FIELDS = {
    "d_conv": ("linear_conv_kernel_dim", "short_conv_kernel_size"),
    "n_ssm_heads": ("linear_num_heads",),
    "d_ssm_head": ("linear_head_dim",),
    "dt_rank": ("linear_head_dim",),
    "ssm_norm_eps": CONFIG_EPSILONS,
}


def is_kimi_delta(module: nn.Module) -> bool:
    """Whether `module` has exactly the parts of Kimi Delta Attention (module docstring)."""
    parts = {n for n, _ in module.named_children()}
    if parts != _PARTS or {n for n, _ in module.named_parameters(recurse=False)}:
        return False
    gate = module.forget_gate
    own = {n for n, _ in gate.named_parameters(recurse=False)}
    return {n for n, _ in gate.named_children()} == _GATE_PARTS and own == _GATE_OWN


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
    shown = dict(
        d_conv=module.conv1d.kernel_size[0], n_ssm_heads=module.b_proj.out_features,
        d_ssm_head=module.o_norm.weight.shape[0],
        dt_rank=module.forget_gate.f_a_proj.out_features,
        ssm_norm_eps=float(module.o_norm.variance_epsilon),
    )  # fmt: skip
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
    return tuple(settings), (("conv_bias", False), ("proj_bias", False))


def rules(at: str, ours: str) -> list[Rule]:
    """The weight table of one Kimi Delta Attention layer at `at` (HF) and `ours`."""
    gate = f"{at}.forget_gate"
    # Our input map -> the HF map and its width (the low-rank maps' first halves).
    inputs = {"q": ("q_proj", "d_inner"), "k": ("k_proj", "d_inner"), "v": ("v_proj", "d_inner"),
              "b": ("b_proj", "ssm_head"), "f_down": ("forget_gate.f_a_proj", "dt_rank"),
              "g_down": ("g_a_proj", "dt_rank")}  # fmt: skip
    A_log = "at_batch at_pos ssm_head one -> (at_batch at_pos ssm_head one)"
    return [
        *(r for n, (hf, width) in inputs.items() for r in (
            Rule(f"{ours}.W_{n}", f"{at}.{hf}.weight", f"{width} d_model -> d_model {width}"),
            zeros(f"{ours}.b_{n}", width))),
        Rule(f"{ours}.W_f_up", f"{gate}.f_b_proj.weight", "d_inner dt_rank -> dt_rank d_inner"),
        Rule(f"{ours}.W_g_up", f"{at}.g_b_proj.weight", "d_inner dt_rank -> dt_rank d_inner"),
        Rule(f"{ours}.W_conv", f"{at}.conv1d.weight",
             "(qkv d_inner) one d_conv -> (qkv d_inner) (one d_conv)"),
        zeros(f"{ours}.b_conv", "(qkv d_inner)"),
        Rule(f"{ours}.dt_bias", f"{gate}.dt_bias", "d_inner -> d_inner"),
        Rule(f"{ours}.A_log", f"{gate}.A_log", A_log),
        Rule(f"{ours}.w_norm", f"{at}.o_norm.weight", "d_ssm_head -> d_ssm_head"),
        Rule(f"{ours}.W_out", f"{at}.o_proj.weight", "d_model d_inner -> d_inner d_model"),
        zeros(f"{ours}.b_out", "d_model"),
    ]  # fmt: skip
