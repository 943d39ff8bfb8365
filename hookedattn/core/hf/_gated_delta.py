"""A hybrid checkpoint's gated delta nets (`components.gated_delta`): recognised by their
parts on the tiny twin (`_mixers` asks), their settings found among the config's fields,
and their weight table in each of the three layouts `transformers` knows:

    "interleaved"   Qwen3-Next: `in_proj_qkvz` holds `[q; k; v; z]` once per key head (its
                    q and k, then the v and z of the value heads it serves), `in_proj_ba`
                    `[b; a]` likewise; the table reads each piece out of every key head's
                    run (a rule's `split_within`)
    "fused_qkv"     Qwen3.5, Lara Mini: `in_proj_qkv` holds `[q; k; v]` whole, one after
                    another; `in_proj_z`, `in_proj_b`, `in_proj_a` apart
    "separate"      OLMo Hybrid: `q_proj`, `k_proj`, `v_proj`, `g_proj` (z), `a_proj`,
                    `b_proj`, the gated norm `o_norm`, the output `o_proj`

The convolution reads `[q; k; v]` in that order in all three. What the module fixes rather
than its config (OLMo Hybrid's gated-norm epsilon, 1e-5 whatever `rms_norm_eps` says; its
`beta` doubled where negative eigenvalues are allowed) is kept as a constant: a twin of the
checkpoint's structure shows the same.
"""

import dataclasses
from typing import Any

from torch import nn

from hookedattn.core.hf._probes import CONFIG_EPSILONS
from hookedattn.core.hf._table import Rule, zeros

# The layout -> its projections' names: (q, k, v, z, b, a) and (norm, out).
_PROJECTIONS = {
    "interleaved": (("in_proj_qkvz",) * 4 + ("in_proj_ba",) * 2, ("norm", "out_proj")),
    "fused_qkv": (("in_proj_qkv",) * 3 + ("in_proj_z", "in_proj_b", "in_proj_a"),
                  ("norm", "out_proj")),
    "separate": (("q_proj", "k_proj", "v_proj", "g_proj", "b_proj", "a_proj"),
                 ("o_norm", "o_proj")),
}  # fmt: skip
_OWN = {"A_log", "dt_bias"}
# Our setting -> the config fields that may hold it (the linear attention's own, never the
# attention's `head_dim`, which a twin may make equal by chance).
_FIELDS = {
    "d_conv": ("linear_conv_kernel_dim",),
    "n_ssm_heads": ("linear_num_value_heads",),
    "d_ssm_head": ("linear_value_head_dim",),
    "d_state": ("linear_key_head_dim",),
    "n_ssm_groups": ("linear_num_key_heads",),
}


@dataclasses.dataclass(frozen=True)
class Found:
    """What `read` found: each setting's config field, the biases, the constants the module
    fixes, and the layout (module docstring)."""

    settings: tuple[tuple[str, str], ...]
    flags: tuple[tuple[str, bool], ...]
    fixed: tuple[tuple[str, float], ...]
    layout: str


def layout_of(module: nn.Module) -> str | None:
    """The module's layout when it is a gated delta net (its projections, a depthwise
    convolution, a gated norm, `A_log` and `dt_bias` and nothing else), else None."""
    parts = {n for n, _ in module.named_children()}
    own = {n for n, _ in module.named_parameters(recurse=False)}
    for layout, (inputs, outputs) in _PROJECTIONS.items():
        if own == _OWN and parts == {*inputs, *outputs, "conv1d"}:
            return layout
    return None


def read(module: nn.Module, config: Any) -> Found:
    """The settings of a gated delta net of `config`'s, found as `_mixers` finds a Mamba-2
    layer's: each by name among the fields that hold the value the module shows."""
    layout = layout_of(module)
    inputs, (norm_name, out) = _PROJECTIONS[layout]
    biased = sorted(n for n in {*inputs, out} if module.get_submodule(n).bias is not None)
    if biased:
        raise ValueError(
            f"a gated delta net whose projections {biased} have biases: not "
            "recognised (those of Qwen3-Next, Qwen3.5, OLMo Hybrid have none)"
        )
    shown = dict(
        d_conv=module.conv1d.kernel_size[0], n_ssm_heads=module.A_log.shape[0],
        d_ssm_head=module.get_submodule(norm_name).weight.shape[0],
        d_state=module.head_k_dim, n_ssm_groups=module.num_k_heads,
    )  # fmt: skip
    settings = []
    for ours, value in shown.items():
        field = next((f for f in _FIELDS[ours] if getattr(config, f, None) == value), None)
        if field is None:
            raise ValueError(
                f"no config field holds the gated delta net's {ours}={value} (looked at "
                f"{_FIELDS[ours]})"
            )
        settings.append((ours, field))
    eps = float(module.get_submodule(norm_name).variance_epsilon)
    field = next((f for f in CONFIG_EPSILONS if getattr(config, f, None) == eps), None)
    fixed = [("delta_beta_scale", 2.0 if getattr(module, "allow_neg_eigval", False) else 1.0)]
    if field is None:
        fixed.append(("ssm_norm_eps", eps))
    else:
        settings.append(("ssm_norm_eps", field))
    flags = (("conv_bias", module.conv1d.bias is not None), ("proj_bias", False))
    return Found(tuple(settings), flags, tuple(fixed), layout)


def rules(at: str, ours: str, layout: str, conv_bias: bool) -> list[Rule]:
    """The weight table of one gated delta net at `at` (HF) and `ours`."""
    (q, k, v, z, b, a), (norm, out) = _PROJECTIONS[layout]
    return [
        *_input_rules(at, ours, layout, dict(q=q, k=k, v=v, z=z, b=b, a=a)),
        *(zeros(f"{ours}.b_{n}", axes) for n, axes in (
            ("q", "d_key"), ("k", "d_key"), ("v", "d_inner"), ("z", "d_inner"),
            ("b", "ssm_head"), ("a", "ssm_head"))),
        Rule(f"{ours}.W_conv", f"{at}.conv1d.weight", "d_qkv one d_conv -> d_qkv (one d_conv)"),
        Rule(f"{ours}.b_conv", f"{at}.conv1d.bias", "d_qkv -> d_qkv")
        if conv_bias
        else zeros(f"{ours}.b_conv", "d_qkv"),
        *(Rule(f"{ours}.{n}", f"{at}.{n}", "ssm_head -> ssm_head") for n in ("dt_bias", "A_log")),
        Rule(f"{ours}.w_norm", f"{at}.{norm}.weight", "d_ssm_head -> d_ssm_head"),
        Rule(f"{ours}.W_out", f"{at}.{out}.weight", "d_model d_inner -> d_inner d_model"),
        zeros(f"{ours}.b_out", "d_model"),
    ]  # fmt: skip


# Each input's rows as axis names: apart, and as a piece of an interleaved key head's run.
_ROWS = {"q": "group d_state", "k": "group d_state", "v": "ssm_head d_ssm_head",
         "z": "ssm_head d_ssm_head", "b": "ssm_head", "a": "ssm_head"}  # fmt: skip
_IN_RUN = {"q": "d_state", "k": "d_state", "v": "per_group d_ssm_head",
           "z": "per_group d_ssm_head", "b": "per_group", "a": "per_group"}  # fmt: skip


def _input_rules(at: str, ours: str, layout: str, names: dict[str, str]) -> list[Rule]:
    """Our `W_q` ... `W_a` from the projections `names` says."""
    found = []
    for name, hf in names.items():
        rows, where = _ROWS[name], {}
        if layout == "fused_qkv" and name in "qkv":
            where = dict(split=tuple(_ROWS[n] for n in "qkv"), part="qkv".index(name))
        if layout == "interleaved":
            fused = "qkvz" if name in "qkvz" else "ba"
            rows = f"group {_IN_RUN[name]}"  # the same rows, counted by key head
            where = dict(split=tuple(_IN_RUN[n] for n in fused), part=fused.index(name),
                         split_within="group")  # fmt: skip
        pattern = f"({rows}) d_model -> d_model ({rows})"
        found.append(Rule(f"{ours}.W_{name}", f"{at}.{hf}.weight", pattern, **where))
    return found
