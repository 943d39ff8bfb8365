"""Our Kimi Delta Attention (`components.kimi_delta`) given the weights of `transformers`'
`KimiLinearDeltaAttention` (a tiny random Kimi Linear's first layer), and of its Bailing
Hybrid form, `BailingHybridDeltaAttention` (full-rank gates, the decay bounded by
`kda_lower_bound`), computes each one's output: this pins the mixer's equations to the
reference one piece at a time (the whole models: `test_hf_kimi_linear.py`,
`test_hf_bailing_hybrid.py`). `transformers` runs the delta rule in float32 whatever the
dtype: 1.8e-7 of the output's scale apart in float64; the bound is 1e-5."""

import pytest
import torch
from helpers.mixers import unpadded_context
from helpers.twins import relative_worst, tiny_twin

from hookedattn.core.components.kimi_delta import KimiDeltaAttention
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.mixer_config import MixerConfig

pytest.importorskip("transformers")


def _holding(mixers: MixerConfig, d_model: int, weights: dict) -> KimiDeltaAttention:
    """Our float64 mixer of `mixers` holding `weights` (zeros for the parameters they lack)."""
    cfg = HookedTransformerConfig(
        n_layers=1, d_model=d_model, n_ctx=32, d_vocab=23, n_heads=2, d_mlp=8,
        dtype=torch.float64, mixers=mixers,
    )  # fmt: skip
    ours = KimiDeltaAttention(cfg)
    zeros = {n: torch.zeros_like(p) for n, p in ours.named_parameters() if n not in weights}
    ours.load_state_dict({n: t.double() for n, t in (weights | zeros).items()})
    return ours


def _worst(ours: KimiDeltaAttention, kda: torch.nn.Module, d_model: int) -> float:
    """The `relative_worst` of our output from `kda`'s on one seeded random input."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 11, d_model, dtype=torch.float64, generator=generator)
    with torch.no_grad():
        return relative_worst(ours(x, unpadded_context(x)), kda(x))


def _ours_of(kda: torch.nn.Module, config) -> KimiDeltaAttention:
    """Our mixer holding `kda`'s weights (zero biases where it keeps none)."""
    H, P = config.linear_num_heads, config.linear_head_dim
    mixers = MixerConfig(
        layers=("kimi_delta",), d_conv=config.linear_conv_kernel_dim, n_ssm_heads=H,
        d_ssm_head=P, dt_rank=P, ssm_norm_eps=config.rms_norm_eps,
    )  # fmt: skip
    gate = kda.forget_gate
    weights = {f"W_{n}": getattr(kda, f"{n}_proj").weight.T for n in "qkvb"} | {
        "W_f_down": gate.f_a_proj.weight.T, "W_f_up": gate.f_b_proj.weight.T,
        "W_g_down": kda.g_a_proj.weight.T, "W_g_up": kda.g_b_proj.weight.T,
        "W_conv": kda.conv1d.weight[:, 0], "dt_bias": gate.dt_bias, "A_log": gate.A_log.reshape(H),
        "w_norm": kda.o_norm.weight, "W_out": kda.o_proj.weight.T,
    }  # fmt: skip
    return _holding(mixers, config.hidden_size, weights)


def test_our_kimi_delta_attention_is_transformers():
    reference = tiny_twin("kimi_linear", seed=1).double()
    kda = reference.model.layers[0].self_attn
    assert type(kda).__name__ == "KimiLinearDeltaAttention"
    ours = _ours_of(kda, reference.config)
    assert _worst(ours, kda, reference.config.hidden_size) <= 1e-5


def _ours_of_bailing(kda: torch.nn.Module, config) -> KimiDeltaAttention:
    """Our mixer in Bailing Hybrid's form holding `kda`'s weights (zero biases)."""
    H, P = config.linear_num_heads, config.linear_head_dim
    mixers = MixerConfig(
        layers=("kimi_delta",), d_conv=config.linear_conv_kernel_dim, n_ssm_heads=H,
        d_ssm_head=P, ssm_norm_eps=config.rms_norm_eps, kda_full_rank_gates=True,
        kda_decay_bound=config.kda_lower_bound,
    )  # fmt: skip
    gate = kda.forget_gate
    weights = {f"W_{n}": getattr(kda, f"{n}_proj").weight.T for n in "qkvbg"} | {
        "W_f": gate.f_proj.weight.T, "W_conv": kda.conv1d.weight[:, 0],
        "dt_bias": gate.dt_bias, "A_log": gate.A_log, "w_norm": kda.o_norm.weight,
        "W_out": kda.o_proj.weight.T,
    }  # fmt: skip
    return _holding(mixers, config.hidden_size, weights)


def test_our_bounded_full_rank_form_is_bailing_hybrids():
    reference = tiny_twin("bailing_hybrid", seed=1).double()
    kda = reference.model.layers[0].self_attn
    assert type(kda).__name__ == "BailingHybridDeltaAttention" and kda.forget_gate.safe_gate
    ours = _ours_of_bailing(kda, reference.config)
    assert _worst(ours, kda, reference.config.hidden_size) <= 1e-5
