"""A Mamba-1 mixer on a tiny twin (`_mixers` recognises the mixers, this module the kind):
its parts, the config fields its settings come from, and the rules of its own weights.

    its parts       `in_proj`, a depthwise `conv1d`, `x_proj` (the low-rank step, `B` and
                    `C` in one map), `dt_proj`, `out_proj`, own parameters `A_log` and `D`
                    (two-dimensional: a decay per channel and state), and either no norms
                    (Mamba) or RMSNorms `b_layernorm`, `c_layernorm`, `dt_layernorm`, with
                    learned gains (Jamba) or none (Falcon Mamba, whose `weight` is a buffer
                    it never reads and never saves: ours import as ones)
    its settings    each read off the module and found among the config fields that hold
                    that value; the inner width as `expand * hidden_size` first (Jamba's
                    `intermediate_size` is its MLP's, and may equal it on the twin)
"""

from typing import Any

from torch import nn

from hookedattn.core.hf._probes import CONFIG_EPSILONS
from hookedattn.core.hf._table import Rule, ones

_PARTS = {"in_proj", "conv1d", "x_proj", "dt_proj", "out_proj", "act"}
_NORMS = ("b_layernorm", "c_layernorm", "dt_layernorm")
_OWN = {"A_log", "D"}
# Our setting -> the config fields that may hold it, the likelier first; `a*b` is a product.
SETTING_FIELDS = {
    "d_conv": ("mamba_d_conv", "conv_kernel", "d_conv"),
    "n_ssm_heads": ("mamba_expand*hidden_size", "expand*hidden_size", "intermediate_size"),
    "d_state": ("mamba_d_state", "state_size", "d_state"),
    "dt_rank": ("mamba_dt_rank", "time_step_rank", "dt_rank"),
    "ssm_norm_eps": ("mixer_rms_eps", *CONFIG_EPSILONS),
}


def is_mamba1(module: nn.Module) -> bool:
    """Whether `module` has a Mamba-1 mixer's parts (module docstring)."""
    parts = {n for n, _ in module.named_children()}
    own = {n for n, _ in module.named_parameters(recurse=False)}
    norms = parts - _PARTS
    two_dimensional = own == _OWN and module.A_log.dim() == 2
    return _PARTS - {"act"} <= parts and norms in (set(), set(_NORMS)) and two_dimensional


def shown(module: nn.Module) -> dict[str, Any]:
    """The settings the twin's module shows: widths, and the norms' epsilon where it has them."""
    d_inner, d_state = module.A_log.shape
    found = dict(
        d_conv=module.conv1d.kernel_size[0],
        n_ssm_heads=d_inner,
        d_state=d_state,
        dt_rank=module.dt_proj.in_features,
    )
    if hasattr(module, "b_layernorm"):
        found["ssm_norm_eps"] = float(module.b_layernorm.variance_epsilon)
    return found


def norm_flags(module: nn.Module) -> tuple[bool, bool]:
    """Whether the mixer normalises `B`, `C` and the step, and whether those norms have
    learned gains (a parameter, not a buffer)."""
    if not hasattr(module, "b_layernorm"):
        return False, False
    gains = {n for n, _ in module.b_layernorm.named_parameters()}
    return True, "weight" in gains


def ssm_rules(at: str, ours: str, norms: bool, gains: bool) -> list[Rule]:
    """The rules of the weights a Mamba-1 mixer has beyond its projections and convolution:
    `x_proj` rows `[dt_low; B; C]`, `dt_proj`, `A_log`, `D` and the norms' gains."""
    pieces = dict(split=("dt_rank", "d_state", "d_state"))
    rules = [
        Rule(f"{ours}.W_dt_down", f"{at}.x_proj.weight", "dt_rank d_inner -> d_inner dt_rank",
             **pieces, part=0),
        Rule(f"{ours}.W_B", f"{at}.x_proj.weight", "d_state d_inner -> d_inner d_state",
             **pieces, part=1),
        Rule(f"{ours}.W_C", f"{at}.x_proj.weight", "d_state d_inner -> d_inner d_state",
             **pieces, part=2),
        Rule(f"{ours}.W_dt_up", f"{at}.dt_proj.weight", "d_inner dt_rank -> dt_rank d_inner"),
        Rule(f"{ours}.b_dt", f"{at}.dt_proj.bias", "d_inner -> d_inner"),
        Rule(f"{ours}.A_log", f"{at}.A_log", "d_inner d_state -> d_inner d_state"),
        Rule(f"{ours}.D", f"{at}.D", "d_inner -> d_inner"),
    ]  # fmt: skip
    if norms:
        for name, theirs, axis in (("B", "b", "d_state"), ("C", "c", "d_state"),
                                   ("dt", "dt", "dt_rank")):  # fmt: skip
            gain = f"{ours}.norm_{name}.w"
            rules.append(
                Rule(gain, f"{at}.{theirs}_layernorm.weight", f"{axis} -> {axis}")
                if gains
                else ones(gain, axis)
            )
    return rules
