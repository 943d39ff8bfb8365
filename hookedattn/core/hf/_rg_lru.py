"""A hybrid checkpoint's Griffin recurrent blocks (`components.rg_lru`, RecurrentGemma's):
recognised by their parts on the tiny twin (`_mixers` asks), their settings found among the
config's fields, and their weight table.

    parts       `linear_x`, `linear_y`, `linear_out`, a depthwise `conv_1d`, an activation
                `act_fn` that is the tanh-approximated GELU, and an `rg_lru` holding
                `recurrent_param` (our `Lambda`) and the block-diagonal gates
                `input_gate_weight`, `recurrent_gate_weight` (`[head d_in d_out]`, applied
                as `u @ W` per head) with their biases
    settings    the convolution's width, the gates' blocks (`n_ssm_heads`) and the channels
                of each (`d_ssm_head`: the LRU's width over the blocks, `lru_width /
                num_attention_heads` in RecurrentGemma's config)
"""

from typing import Any

import torch
from torch import nn

from hookedattn.core.hf._table import Rule

_PARTS = {"act_fn", "conv_1d", "linear_out", "linear_x", "linear_y", "rg_lru"}
_LRU_OWN = {"recurrent_param", "input_gate_weight", "input_gate_bias",
            "recurrent_gate_weight", "recurrent_gate_bias"}  # fmt: skip
# Our setting -> the config fields (or `a/b` quotients of two) that may hold it.
_FIELDS = {
    "d_conv": ("conv1d_width",),
    "n_ssm_heads": ("num_attention_heads",),
    "d_ssm_head": ("lru_width/num_attention_heads",),
}


def is_rg_lru(module: nn.Module) -> bool:
    """Whether `module` has exactly the parts of Griffin's recurrent block (docstring)."""
    parts = {n for n, _ in module.named_children()}
    if parts != _PARTS or {n for n, _ in module.named_parameters(recurse=False)}:
        return False
    return {n for n, _ in module.rg_lru.named_parameters()} == _LRU_OWN


def _is_tanh_gelu(act: nn.Module) -> bool:
    """Whether `act` computes the tanh-approximated GELU (the block's gate, fixed here)."""
    probe = torch.linspace(-6, 6, 97, dtype=torch.float64)
    return torch.allclose(act(probe), nn.functional.gelu(probe, approximate="tanh"), atol=1e-12)


def field_value(config: Any, field: str) -> Any:
    """A config field's value; `a/b`: the quotient of two fields' (exact: an int)."""
    if "/" not in field:
        return getattr(config, field, None)
    top, bottom = (getattr(config, name, None) for name in field.split("/"))
    if not isinstance(top, int) or not isinstance(bottom, int) or bottom < 1 or top % bottom:
        return None
    return top // bottom


def read(module: nn.Module, config: Any) -> tuple[tuple[tuple[str, str], ...], tuple]:
    """Each setting's config field (the one that holds what the twin's module shows), and the
    biases' flags."""
    if not _is_tanh_gelu(module.act_fn):
        raise ValueError(
            f"a Griffin recurrent block whose gate activation {type(module.act_fn).__name__} "
            "is not the tanh-approximated GELU: not recognised"
        )
    gates = module.rg_lru.input_gate_weight
    shown = dict(d_conv=module.conv_1d.kernel_size[0], n_ssm_heads=gates.shape[0],
                 d_ssm_head=gates.shape[1])  # fmt: skip
    settings = []
    for ours, value in shown.items():
        field = next((f for f in _FIELDS[ours] if field_value(config, f) == value), None)
        if field is None:
            raise ValueError(
                f"no config field holds the recurrent block's {ours}={value} (looked at "
                f"{_FIELDS[ours]})"
            )
        settings.append((ours, field))
    projections = (module.linear_x, module.linear_y, module.linear_out)
    if any(p.bias is None for p in projections) or module.conv_1d.bias is None:
        raise ValueError("a Griffin recurrent block without biases: not recognised")
    return tuple(settings), (("conv_bias", True), ("proj_bias", True))


def rules(at: str, ours: str) -> list[Rule]:
    """The weight table of one recurrent block at `at` (HF) and `ours`."""
    lru = f"{at}.rg_lru"
    gates = [
        rule
        for hf, name in (("input_gate", "i"), ("recurrent_gate", "a"))
        for rule in (
            Rule(f"{ours}.W_{name}", f"{lru}.{hf}_weight",
                 "ssm_head d_ssm_head d_ssm_head_out -> ssm_head d_ssm_head d_ssm_head_out"),
            Rule(f"{ours}.b_{name}", f"{lru}.{hf}_bias",
                 "ssm_head d_ssm_head -> (ssm_head d_ssm_head)"),
        )
    ]  # fmt: skip
    return [
        *(r for n in "xy" for r in (
            Rule(f"{ours}.W_{n}", f"{at}.linear_{n}.weight", "d_inner d_model -> d_model d_inner"),
            Rule(f"{ours}.b_{n}", f"{at}.linear_{n}.bias", "d_inner -> d_inner"))),
        Rule(f"{ours}.W_conv", f"{at}.conv_1d.weight",
             "d_inner one d_conv -> d_inner (one d_conv)"),
        Rule(f"{ours}.b_conv", f"{at}.conv_1d.bias", "d_inner -> d_inner"),
        *gates,
        Rule(f"{ours}.Lambda", f"{lru}.recurrent_param", "d_inner -> d_inner"),
        Rule(f"{ours}.W_out", f"{at}.linear_out.weight", "d_model d_inner -> d_inner d_model"),
        Rule(f"{ours}.b_out", f"{at}.linear_out.bias", "d_model -> d_model"),
    ]  # fmt: skip
