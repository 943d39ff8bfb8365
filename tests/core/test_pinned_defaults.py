"""Every default and constant the model computes with, pinned against its outside source.

The expected values are written here from the source each line cites, never read from our
config or from `hookedattn.testing.published` (whose own values are pinned at the end): a
wrong default in `HookedTransformerConfig` changes every default model, its reference and its
identity checks alike unless something outside holds it. Sources:

    TL       TransformerLens 3.5.1, `transformer_lens/config/hooked_transformer_config.py`
             and `transformer_lens/components/{layer_norm,rms_norm}.py`
    Vaswani  Vaswani et al. 2017, "Attention Is All You Need", sec. 3.2.1, eq. 1
    RoFormer Su et al. 2021, "RoFormer", sec. 3.2.2 (eq. 15 and the rotation of eq. 34),
             in GPT-NeoX's layout (pairs `i, i + d/2`)
    GELU     Hendrycks & Gimpel 2016, sec. 2 (exact: `x Phi(x)`; tanh form: 0.044715)
    LN, RMS  Ba et al. 2016, eq. 4; Zhang & Sennrich 2019, eq. 4
    Llama 3  Meta's Llama 3.1 `rope_scaling`: factor 8, low 1, high 4, original context 8192

Where a default reaches the computation through a kernel (the fused norm and attention), it
is pinned on both execution paths: the fused kernels and `use_fused_kernels=False`.
"""

import json
import math

import pytest
import torch

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core.components import (
    LayerNorm,
    RMSNorm,
    Rotary,
    SoftCap,
    rotary_frequencies,
)
from hookedattn.core.components.mlp import ACTIVATIONS
from hookedattn.testing import published
from hookedattn.testing.published import published_constants

SHAPE = dict(n_layers=1, d_model=64, n_ctx=8, d_vocab=10, d_head=16, d_mlp=32)
PATHS = {"fused": True, "written_out": False}


def config(**overrides) -> HookedTransformerConfig:
    return HookedTransformerConfig(**{**SHAPE, **overrides})


# ------------------------------------------------------------- the config's defaults
def test_the_norm_epsilon_defaults_to_tl_s_1e_minus_5():
    assert config().eps == 1e-5  # TL: "eps ... Defaults to 1e-5"


@pytest.mark.parametrize(("d_head", "scale"), [(16, 4.0), (64, 8.0), (5, 2.2360679774997896)])
def test_the_attention_scale_defaults_to_sqrt_d_head(d_head, scale):
    # Vaswani: scores = q k^T / sqrt(d_k); TL: attn_scale defaults to np.sqrt(d_head).
    assert config(d_head=d_head, n_heads=2).attn_scale == pytest.approx(scale, rel=1e-15)


@pytest.mark.parametrize(("d_model", "init_range"), [(64, 0.1), (16, 0.2), (100, 0.08)])
def test_the_init_range_defaults_to_0_8_over_sqrt_d_model(d_model, init_range):
    # TL: initializer_range "initialized to 0.8 / sqrt(d_model)".
    cfg = config(d_model=d_model, d_head=4)
    assert cfg.init_range == pytest.approx(init_range, rel=1e-15)


def test_rotary_defaults_are_roformers_base_and_the_whole_head():
    cfg = config(positional_embedding_type="rotary")
    assert cfg.rotary_base == 10000.0  # RoFormer eq. 15; TL rotary_base = 10000
    assert cfg.rotary_dim == 16  # TL: "if positional_embedding_type == 'rotary' ... d_head"
    assert cfg.rotary_scaling_factor == 1.0  # TL: no scaling


def test_llama3_rope_band_defaults_are_metas():
    cfg = config()
    assert (cfg.NTK_by_parts_factor, cfg.NTK_by_parts_low_freq_factor) == (8.0, 1.0)
    assert (cfg.NTK_by_parts_high_freq_factor, cfg.NTK_original_ctx_len) == (4.0, 8192)


def test_the_variant_defaults_are_tl_s():
    cfg = config()
    assert cfg.act_fn == "relu"  # TL: act_fn = "relu"
    assert cfg.normalization_type == "LN"  # TL: normalization_type = "LN"
    assert cfg.positional_embedding_type == "standard"  # TL: "Defaults to 'standard'"
    assert cfg.normalization_placement == "pre"
    assert cfg.d_vocab_out == 10  # TL: d_vocab_out -1 "will be equal to d_vocab"
    assert cfg.dtype == torch.float32  # TL: "Defaults to torch.float32"
    assert (cfg.attn_only, cfg.gated_mlp, cfg.parallel_attn_mlp) == (False, False, False)


def test_every_shipped_model_was_trained_with_the_published_constants():
    # The shipped configs store their constants; the reference and the identity checks hold
    # the shipped models to the published ones, so these must agree (or be stated there).
    from hookedattn import list_pretrained

    for info in list_pretrained():
        stored = json.loads((info.path / "config.json").read_text())["config"]
        assert stored["eps"] == 1e-5, info.name
        assert stored["attn_scale"] == stored["d_head"] ** 0.5, info.name


# -------------------------------------------------------------- the initialisation
def test_weights_are_drawn_at_the_init_range_and_biases_and_gains_start_neutral():
    # TL's "gpt2" init: every W_ is N(0, initializer_range^2); biases 0; LayerNorm w = 1.
    model = HookedTransformer(config(d_vocab=1000, d_mlp=256, seed=0))
    W_E = model.W_E.detach()  # 64,000 draws: the std is within 1% of 0.1 at > 5 sigma
    assert W_E.std().item() == pytest.approx(0.1, rel=0.01)
    assert abs(W_E.mean().item()) < 0.002
    assert model.blocks[0].mlp.W_in.detach().std().item() == pytest.approx(0.1, rel=0.02)
    assert torch.equal(model.blocks[0].attn.b_Q, torch.zeros_like(model.blocks[0].attn.b_Q))
    assert torch.equal(model.ln_final.w, torch.ones(64))
    assert torch.equal(model.ln_final.b, torch.zeros(64))


# ----------------------------------------------------------- the norms' formulas
def norm_of(kind: type, x: list[float], path: str, w=None, b=None) -> torch.Tensor:
    """`kind` (LayerNorm, RMSNorm) of a default float64 config over `len(x)` features, on
    one execution path, applied to `x` (with gain `w` and bias `b` where given)."""
    cfg = config(d_model=len(x), d_head=1, dtype=torch.float64, use_fused_kernels=PATHS[path])
    norm = kind(cfg)
    with torch.no_grad():
        if w is not None:
            norm.w.copy_(torch.tensor(w))
        if b is not None:
            norm.b.copy_(torch.tensor(b))
    return norm(torch.tensor(x, dtype=torch.float64)[None, None]).detach()[0, 0]


@pytest.mark.parametrize("path", PATHS)
def test_layer_norm_centres_then_divides_by_the_root_of_the_variance_plus_1e_minus_5(path):
    # Ba et al.: (x - mean) / sqrt(var + eps), the biased variance (TL's layer_norm.py).
    # [3, 1, 3, 1]: mean 2, centred [1, -1, 1, -1], variance 1.
    expected = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64) / math.sqrt(1 + 1e-5)
    got = norm_of(LayerNorm, [3.0, 1.0, 3.0, 1.0], path)
    torch.testing.assert_close(got, expected, rtol=1e-14, atol=0.0)


@pytest.mark.parametrize("path", PATHS)
def test_rms_norm_divides_by_the_root_mean_square_plus_1e_minus_5_without_centring(path):
    # Zhang & Sennrich: x / sqrt(mean(x^2) + eps); [3, 1, 3, 1]: mean square 5.
    expected = torch.tensor([3.0, 1.0, 3.0, 1.0], dtype=torch.float64) / math.sqrt(5 + 1e-5)
    got = norm_of(RMSNorm, [3.0, 1.0, 3.0, 1.0], path)
    torch.testing.assert_close(got, expected, rtol=1e-14, atol=0.0)


@pytest.mark.parametrize("kind", [LayerNorm, RMSNorm])
@pytest.mark.parametrize("path", PATHS)
def test_the_epsilon_sits_inside_the_root_where_it_dominates_a_small_stream(kind, path):
    # A stream of variance 1e-6: sqrt(1e-6 + 1e-5) = 3.317e-3, so 1e-3 / that = 0.30151;
    # eps outside the root (1e-3 + 1e-5) would give 0.990, eps 1e-6 would give 0.7071.
    got = norm_of(kind, [1e-3, -1e-3, 1e-3, -1e-3], path)
    expected = 1e-3 / math.sqrt(1e-6 + 1e-5)
    torch.testing.assert_close(got.abs(), torch.full((4,), expected, dtype=torch.float64))


@pytest.mark.parametrize("path", PATHS)
def test_layer_norm_applies_its_gain_then_its_bias(path):
    # TL's layer_norm.py: `x * self.w + self.b`, after the division.
    got = norm_of(LayerNorm, [3.0, 1.0, 3.0, 1.0], path, w=[2.0, 3.0, 4.0, 5.0], b=[1.0] * 4)
    unit = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64) / math.sqrt(1 + 1e-5)
    expected = unit * torch.tensor([2.0, 3.0, 4.0, 5.0], dtype=torch.float64) + 1.0
    torch.testing.assert_close(got, expected, rtol=1e-14, atol=1e-15)


@pytest.mark.parametrize("path", PATHS)
def test_rms_norm_applies_its_gain(path):
    got = norm_of(RMSNorm, [3.0, 1.0, 3.0, 1.0], path, w=[2.0, 3.0, 4.0, 5.0])
    expected = torch.tensor([6.0, 3.0, 12.0, 5.0], dtype=torch.float64) / math.sqrt(5 + 1e-5)
    torch.testing.assert_close(got, expected, rtol=1e-14, atol=0.0)


@pytest.mark.parametrize("kind", [LayerNorm, RMSNorm])
@pytest.mark.parametrize("path", PATHS)
def test_an_epsilon_set_in_the_config_is_the_one_used_on_both_paths(kind, path):
    # eps 1e-2 on [3, 1, 3, 1]: LayerNorm's unit stream / sqrt(1.01), RMSNorm's / sqrt(5.01).
    cfg = config(d_model=4, d_head=1, dtype=torch.float64, use_fused_kernels=PATHS[path])
    norm = kind(cfg.replace(eps=1e-2))
    got = norm(torch.tensor([[[3.0, 1.0, 3.0, 1.0]]], dtype=torch.float64)).detach()[0, 0]
    if kind is LayerNorm:
        expected = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64) / math.sqrt(1.01)
    else:
        expected = torch.tensor([3.0, 1.0, 3.0, 1.0], dtype=torch.float64) / math.sqrt(5.01)
    torch.testing.assert_close(got, expected, rtol=1e-14, atol=0.0)


# ------------------------------------------------------- the attention's scale
def attention_model(path: str, **overrides) -> HookedTransformer:
    fields = dict(attn_only=True, n_heads=4, seed=3, dtype=torch.float64)
    return HookedTransformer(config(**fields, use_fused_kernels=PATHS[path], **overrides))


def z_by_hand(q, k, v, scale: float) -> torch.Tensor:
    """softmax(q k^T / scale, causal) v, per head: Vaswani eq. 1."""
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) / scale
    future = torch.ones(scores.shape[-2:], dtype=torch.bool).triu(1)
    pattern = scores.masked_fill(future, -math.inf).softmax(-1)
    return torch.einsum("bhqk,bkhd->bqhd", pattern, v)


@pytest.mark.parametrize("path", PATHS)
def test_attention_divides_the_scores_by_sqrt_d_head_on_both_paths(path):
    # d_head 16: the scores are q . k / 4. Caching only q, k, v and z leaves the scores and
    # pattern unread, so the fused path runs where the config allows it.
    model = attention_model(path)
    tokens = torch.tensor([[1, 7, 2, 9, 4, 4, 0, 3]])
    names = ("blocks.0.attn.hook_q", "blocks.0.attn.hook_k", "blocks.0.attn.hook_v")
    _, cache = model.run_with_cache(tokens, names_filter=[*names, "blocks.0.attn.hook_z"])
    q, k, v = (cache[name] for name in names)
    torch.testing.assert_close(cache["z", 0], z_by_hand(q, k, v, 4.0), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("path", PATHS)
def test_an_attention_scale_set_in_the_config_is_the_one_used_on_both_paths(path):
    model = attention_model(path, attn_scale=1.5)
    tokens = torch.tensor([[1, 7, 2, 9, 4, 4, 0, 3]])
    names = ("blocks.0.attn.hook_q", "blocks.0.attn.hook_k", "blocks.0.attn.hook_v")
    _, cache = model.run_with_cache(tokens, names_filter=[*names, "blocks.0.attn.hook_z"])
    q, k, v = (cache[name] for name in names)
    torch.testing.assert_close(cache["z", 0], z_by_hand(q, k, v, 1.5), rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------------ the rotation
def test_rotary_frequencies_are_roformers_base_to_the_minus_2i_over_d():
    # theta_i = 10000^(-2i/d), d = 8: 1, 10000^(-1/4) = 0.1, 0.01, 0.001.
    cfg = config(d_head=8, positional_embedding_type="rotary")
    expected = torch.tensor([1.0, 0.1, 0.01, 0.001])
    torch.testing.assert_close(rotary_frequencies(cfg), expected, rtol=1e-6, atol=0.0)


def test_partial_rotary_frequencies_run_over_the_rotated_dimensions_only():
    # rotary_dim 4 of d_head 8: theta_i = 10000^(-2i/4) = 1, 0.01.
    cfg = config(d_head=8, positional_embedding_type="rotary", rotary_dim=4)
    torch.testing.assert_close(
        rotary_frequencies(cfg), torch.tensor([1.0, 0.01]), rtol=1e-6, atol=0
    )


@pytest.mark.parametrize(("unit", "at_cos", "at_sin"), [(0, 0, 4), (4, 4, 0)])
def test_rotary_turns_each_pair_i_and_i_plus_half_by_position_times_theta(unit, at_cos, at_sin):
    # RoFormer's rotation of a pair (x_i, x_{i+d/2}) by angle m theta_i, GPT-NeoX layout:
    # (x_i cos - x_{i+d/2} sin, x_{i+d/2} cos + x_i sin). Unit vector e_0 at position 3:
    # cos 3 at index 0, sin 3 at index 4; e_4: -sin 3 at index 0, cos 3 at index 4.
    cfg = config(d_head=8, positional_embedding_type="rotary", dtype=torch.float64)
    x = torch.zeros(1, 1, 1, 8, dtype=torch.float64)
    x[..., unit] = 1.0
    rotated = Rotary(cfg)(x, torch.tensor([[3]]))[0, 0, 0]
    expected = torch.zeros(8, dtype=torch.float64)
    expected[at_cos] = math.cos(3.0)
    expected[at_sin] = math.sin(3.0) * (1 if unit == 0 else -1)
    torch.testing.assert_close(rotated, expected, rtol=0.0, atol=1e-6)  # float32 angles


def test_rotary_leaves_the_dimensions_past_rotary_dim_alone():
    cfg = config(d_head=8, positional_embedding_type="rotary", rotary_dim=4, dtype=torch.float64)
    x = torch.arange(8, dtype=torch.float64).reshape(1, 1, 1, 8)
    rotated = Rotary(cfg)(x, torch.tensor([[5]]))
    assert torch.equal(rotated[..., 4:], x[..., 4:])


# -------------------------------------------------------------- the activations
def test_gelu_new_is_the_tanh_approximation_with_0_044715():
    x = torch.linspace(-4, 4, 81, dtype=torch.float64)
    expected = 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    torch.testing.assert_close(ACTIVATIONS["gelu_new"](x), expected, rtol=1e-14, atol=1e-15)


def test_gelu_is_the_exact_x_phi_x_and_differs_from_the_tanh_form():
    x = torch.linspace(-4, 4, 81, dtype=torch.float64)
    expected = x * 0.5 * (1 + torch.erf(x / math.sqrt(2)))
    torch.testing.assert_close(ACTIVATIONS["gelu"](x), expected, rtol=1e-14, atol=1e-15)
    assert (ACTIVATIONS["gelu"](x) - ACTIVATIONS["gelu_new"](x)).abs().max() > 1e-4


def test_silu_and_relu_are_their_formulas():
    x = torch.linspace(-4, 4, 81, dtype=torch.float64)
    torch.testing.assert_close(ACTIVATIONS["silu"](x), x / (1 + torch.exp(-x)))
    assert torch.equal(ACTIVATIONS["relu"](x), x.clamp(min=0))


def test_the_soft_cap_is_c_tanh_x_over_c():
    # Gemma 2's soft cap (its `attn_logit_softcapping`, `final_logit_softcapping`).
    x = torch.linspace(-10, 10, 41, dtype=torch.float64)
    torch.testing.assert_close(SoftCap(3.0)(x), 3.0 * torch.tanh(x / 3.0))


# ------------------------------------------- the published constants themselves
def test_the_published_constants_are_their_sources_numbers():
    assert published.NORM_EPS == 1e-5
    assert published.ROTARY_BASE == 10000.0
    assert published.GELU_TANH_CUBIC == 0.044715
    assert pytest.approx(0.7978845608028654, rel=1e-15) == published.GELU_TANH_SQRT_2_OVER_PI
    assert published.attention_scale(64) == 8.0
    constants = published_constants(16)
    assert (constants.attn_scale, constants.eps, constants.rotary_base) == (4.0, 1e-5, 10000.0)


def test_published_constants_name_what_the_caller_stated_and_refuse_unknown_names():
    assert published_constants(16, eps=1e-6).stated == ("eps",)
    with pytest.raises(TypeError, match=r"unknown constants \['epsilon'\]"):
        published_constants(16, epsilon=1e-6)
    with pytest.raises(ValueError, match="d_head must be a positive int, got 0"):
        published_constants(0)
