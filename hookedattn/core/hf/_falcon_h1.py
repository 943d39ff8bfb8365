"""Falcon-H1 (`FalconH1ForCausalLM`): in every layer a Mamba-2 mixer beside the attention,
both reading the same normed stream, then a gated MLP,

    resid_mid  = resid_pre + attn(ln1(resid_pre)) + mixer(ln1(resid_pre))
    resid_post = resid_mid + mlp(ln2(resid_mid))

our `ParallelMixerBlock` (`MixerConfig.beside_attention="mamba2"`); the attention and the MLP
are Llama's, the mixer is our `Mamba2Mixer` (without its gated norm where
`mamba_rms_norm=False`, Falcon-H1's default).

Written out, not derived by convention: the convention reads a layer whose mixing
sublayer is attention or a mixer, and follows tensors by identity, which Falcon-H1's
`hidden_states * attention_in_multiplier` breaks.

Falcon-H1's muP multipliers are scalars (or, `ssm_multipliers`, one scalar per piece of the
mixer's input projection), each multiplying a linear map's input or output, so each is folded
here into the weights it multiplies, and the model is our plain components:

    embedding_multiplier           W_E
    lm_head_multiplier             W_U
    attention_in_multiplier        W_Q, W_K, W_V (the attention's input; not its biases)
    key_multiplier                 W_K, b_K (before the rotation, which is linear)
    attention_out_multiplier       W_O, b_O
    ssm_in_multiplier              W_z, W_xBC, W_dt (the mixer's input; not its biases)
    ssm_multipliers [z, x, B, C, dt]   the columns of W_z, W_xBC, W_dt and their biases
    ssm_out_multiplier             the mixer's W_out, b_out
    mlp_multipliers [gate, down]   W_gate; the MLP's W_out, b_out
"""

from typing import Any

import torch
from torch import Tensor

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _translate
from hookedattn.core.hf._family import Family
from hookedattn.core.hf._llama import llama_like_rules, llama_like_table
from hookedattn.core.hf._mixers import _conv_rules, _input_rules, _output_rules
from hookedattn.core.hf._table import Rule, Table
from hookedattn.core.mixer_config import MixerConfig

_L = "model.layers.{layer}"
_NORMS = {"ln1": "input_layernorm", "ln2": "pre_ff_layernorm"}


def _d_inner(c: Any) -> int:
    """The mixer's inner width: `mamba_d_ssm`, else `mamba_expand * hidden_size`."""
    return int(c.mamba_expand * c.hidden_size) if c.mamba_d_ssm is None else c.mamba_d_ssm


def falcon_h1_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a Falcon-H1 config; a variant we do not compute is refused."""
    c = hf_config
    if c.mamba_n_heads * c.mamba_d_head != _d_inner(c):
        raise ValueError(
            f"mamba_n_heads * mamba_d_head = {c.mamba_n_heads * c.mamba_d_head} differs from "
            f"the mixer's width {_d_inner(c)} (mamba_d_ssm / mamba_expand): not imported"
        )
    if c.mamba_rms_norm and c.mamba_norm_before_gate:
        raise ValueError(
            "mamba_rms_norm=True with mamba_norm_before_gate=True (norm, then gate) is not "
            "imported: our Mamba-2 mixer gates before its norm"
        )
    if getattr(c, "mlp_bias", False):
        raise ValueError("mlp_bias=True cannot be imported: our gated MLP's gate has no bias")
    mixers = MixerConfig(
        layers=("attention",) * c.num_hidden_layers,
        beside_attention="mamba2",
        d_conv=c.mamba_d_conv,
        conv_bias=bool(c.mamba_conv_bias),
        proj_bias=bool(c.mamba_proj_bias or c.projectors_bias),
        n_ssm_heads=c.mamba_n_heads,
        d_ssm_head=c.mamba_d_head,
        d_state=c.mamba_d_state,
        n_ssm_groups=c.mamba_n_groups,
        dt_min=float(c.time_step_limit[0]),
        dt_max=float(c.time_step_limit[1]),
        ssm_norm_eps=c.rms_norm_eps,
        ssm_gated_norm=bool(c.mamba_rms_norm),
    )
    return _translate.llama_like(c) | {"mixers": mixers}


def _scaled(rule: Rule, factor: float | Tensor) -> Rule:
    """`rule` with its tensor multiplied by `factor` (a scalar, or one per last-axis entry)."""
    if rule.hf is None or (isinstance(factor, float) and factor == 1.0):
        return rule
    before = rule.adjust or (lambda t: t)
    # A float multiplies in float64 (as HF's Python float multiplies a float64 model), not
    # rounded to the default dtype first.
    exact = torch.as_tensor(factor, dtype=torch.float64)
    return Rule(**{**rule.__dict__, "adjust": lambda t: before(t) * exact.to(t)})


def _attention_and_mlp_rules(c: Any, cfg: HookedTransformerConfig) -> list[Rule]:
    """Llama's rules with Falcon-H1's names and its attention's and MLP's multipliers."""
    bias = bool(getattr(c, "attention_bias", False))
    gate, down = (float(m) for m in c.mlp_multipliers)
    attn_in, key = float(c.attention_in_multiplier), float(c.key_multiplier)
    factors: dict[str, float] = {
        "attn.W_Q": attn_in, "attn.W_K": attn_in * key, "attn._W_K": attn_in * key,
        "attn.W_V": attn_in, "attn._W_V": attn_in, "attn.b_K": key, "attn._b_K": key,
        "attn.W_O": float(c.attention_out_multiplier),
        "attn.b_O": float(c.attention_out_multiplier),
        "mlp.W_gate": gate, "mlp.W_out": down, "mlp.b_out": down,
        "embed.W_E": float(c.embedding_multiplier), "unembed.W_U": float(c.lm_head_multiplier),
    }  # fmt: skip
    rules = []
    for rule in llama_like_rules(cfg, norms=_NORMS, qkv_bias=bias, o_bias=bias):
        hf = None if rule.hf is None else rule.hf.replace(".mlp.", ".feed_forward.")
        hf = None if hf is None else hf.replace("model.norm.", "model.final_layernorm.")
        rule = Rule(**{**rule.__dict__, "hf": hf})
        name = rule.ours.removeprefix("blocks.{layer}.")
        rules.append(_scaled(rule, factors.get(name, 1.0)))
    return rules


def _mixer_rules(c: Any, cfg: HookedTransformerConfig) -> list[Rule]:
    """The mixer's rules (`_mixers`' pieces of `in_proj`), with its multipliers."""
    m = cfg.mixers
    at, ours = f"{_L}.mamba", "blocks.{layer}.mixer"
    z, x, B, C, dt = (float(s) for s in c.ssm_multipliers)
    group_state = m.n_ssm_groups * m.d_state
    # HF multiplies the mixer's input projection by `mup_vector`, a float32 buffer: its
    # values are the multipliers rounded to float32 (and then multiplied in float64).
    xbc = torch.tensor([x] * m.d_inner + [B] * group_state + [C] * group_state).double()
    z, dt = (float(torch.tensor(v, dtype=torch.float32)) for v in (z, dt))
    inputs = _input_rules(at, ours, ("z", "xBC", "dt"), ("d_inner", "d_xbc", "ssm_head"),
                          bool(c.mamba_proj_bias))  # fmt: skip
    ssm_in = float(c.ssm_in_multiplier)
    pieces: dict[str, float | Tensor] = {"z": z, "xBC": xbc, "dt": dt}
    scaled = []
    for rule in inputs:
        piece = rule.ours.rsplit("_", 1)[1]
        factor = pieces[piece] * (ssm_in if rule.ours.rsplit(".", 1)[1].startswith("W") else 1.0)
        scaled.append(_scaled(rule, factor))
    out = float(c.ssm_out_multiplier)
    per_head = [Rule(f"{ours}.{n}", f"{at}.{n}", "ssm_head -> ssm_head")
                for n in ("dt_bias", "A_log", "D")]  # fmt: skip
    norm = [Rule(f"{ours}.w_norm", f"{at}.norm.weight", "d_inner -> d_inner")]
    return [
        *scaled,
        *_conv_rules(f"{at}.conv1d", ours, "d_xbc", bool(c.mamba_conv_bias)),
        *per_head,
        *(norm if m.ssm_gated_norm else []),
        *(_scaled(r, out) for r in _output_rules(at, ours, "d_inner", bool(c.projectors_bias))),
    ]


def falcon_h1_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """Falcon-H1's table: Llama's under its names, the mixer's, every multiplier folded."""
    rules = [*_attention_and_mlp_rules(hf_config, cfg), *_mixer_rules(hf_config, cfg)]
    return llama_like_table(hf_config, cfg, rules, "Falcon-H1")


FAMILY = Family("FalconH1ForCausalLM", "falcon_h1", falcon_h1_fields, falcon_h1_table)
