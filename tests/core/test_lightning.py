"""Lightning attention (`LightningAttention`), against its recurrence written here position
by position in float64 (a state `S_t = exp(-lambda) S_{t-1} + k_t v_t^T` per head, read by
`q_t`: MiniMax's step by step form); and a hybrid model holding one: causality, padding,
the hook points, weight processing, generation, saving and loading; and the normed-skip
block it comes in (`NormedSkipBlock`)."""

import dataclasses

import pytest
import torch
from helpers.mixers import (
    D_MODEL,
    assert_causal_and_float32_close,
    assert_generation_reruns_the_prefix,
    assert_padding_reaches_no_real_token,
    assert_processing_keeps_the_log_probs,
    hybrid_cfg,
    random_hybrid,
    randomised,
    unpadded_context,
)
from helpers.saving import assert_saves_and_loads
from torch.nn.functional import sigmoid, silu

from hookedattn import HookedTransformer
from hookedattn.core.components.lightning import LightningAttention

KINDS = ("lightning", "attention", "lightning")
SETTINGS = dict(n_ssm_heads=3, d_ssm_head=4, n_ssm_groups=1)


def _positive_rates(mixer: LightningAttention) -> LightningAttention:
    """`mixer` with decay rates in (0.1, 1.1), as MiniMax's slopes are positive."""
    with torch.no_grad():
        mixer.decay_rate.copy_(mixer.decay_rate.abs() + 0.1)
    return mixer


def _by_recurrence(mixer: LightningAttention, x: torch.Tensor) -> torch.Tensor:
    """The module docstring's output, one position at a time, one head at a time."""
    m = mixer.settings
    H, P = m.n_ssm_heads, m.d_ssm_head
    batch, n_pos, _ = x.shape
    state = torch.zeros(batch, H, P, P, dtype=x.dtype)
    out = torch.zeros(batch, n_pos, D_MODEL, dtype=x.dtype)
    for t in range(n_pos):
        q, k, v = (silu(x[:, t] @ getattr(mixer, f"W_{n}") + getattr(mixer, f"b_{n}"))
                   .reshape(batch, H, P) for n in "qkv")  # fmt: skip
        o = torch.zeros(batch, H, P, dtype=x.dtype)
        for h in range(H):
            decay = torch.exp(-mixer.decay_rate[h])
            state[:, h] = decay * state[:, h] + k[:, h, :, None] * v[:, h, None, :]
            o[:, h] = (q[:, h, :, None] * state[:, h]).sum(-2)
        o = o.reshape(batch, H * P)
        normed = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + m.ssm_norm_eps) * mixer.w_norm
        gate = sigmoid(x[:, t] @ mixer.W_gate + mixer.b_gate)
        out[:, t] = (gate * normed) @ mixer.W_out + mixer.b_out
    return out


def _mixer(seed: int, **settings) -> LightningAttention:
    cfg = hybrid_cfg(("lightning",), **SETTINGS | settings)
    return _positive_rates(randomised(LightningAttention(cfg), seed))


@pytest.mark.parametrize("float32_decays", [False, True])
def test_lightning_attention_is_its_recurrence(float32_decays) -> None:
    mixer = _mixer(1, lightning_decay_float32=float32_decays)
    x = torch.randn(2, 9, D_MODEL, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        got, expected = mixer(x, unpadded_context(x)), _by_recurrence(mixer, x)
    # float32 decays: each within float32's rounding of the exact one.
    bound = 1e-6 if float32_decays else 1e-12
    torch.testing.assert_close(got, expected, rtol=0, atol=bound * float(expected.abs().max()))


def test_the_decay_moves_the_output() -> None:
    mixer = _mixer(3)
    x = torch.randn(1, 8, D_MODEL, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    with torch.no_grad():
        decayed = mixer(x, unpadded_context(x))
        mixer.decay_rate.zero_()
        kept = mixer(x, unpadded_context(x))
    assert float((decayed - kept).abs().max()) > 1e-2 * float(kept.abs().max())


def test_lightning_attention_is_causal_and_float32_close() -> None:
    mixer = _mixer(3)
    single = LightningAttention(hybrid_cfg(("lightning",), dtype=torch.float32, **SETTINGS))
    x = torch.randn(1, 10, D_MODEL, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    with torch.no_grad():
        assert_causal_and_float32_close(mixer, single, x)


def _hybrid(**fields) -> HookedTransformer:
    model = random_hybrid(dataclasses.replace(hybrid_cfg(KINDS, **SETTINGS), **fields), 5)
    for i in (0, 2):
        _positive_rates(model.blocks[i].mixer)
    return model


def test_the_pattern_decays_with_distance_and_the_heads_read_it() -> None:
    model = _hybrid()
    tokens = torch.randint(0, 23, (2, 8), generator=torch.Generator().manual_seed(6))
    _, cache = model.run_with_cache(tokens)
    pattern = cache["blocks.0.mixer.hook_pattern"]
    assert pattern.shape == (2, 3, 8, 8)
    assert bool((pattern.triu(1) == 0).all())  # causal
    assert cache["blocks.2.mixer.hook_o"].shape == (2, 8, 3, 4)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_reaches_no_real_token_of_a_lightning_hybrid(side: str) -> None:
    assert_padding_reaches_no_real_token(_hybrid(), side)


def test_lightning_weight_processing_keeps_the_log_probs() -> None:
    model = randomised(HookedTransformer(hybrid_cfg(KINDS, **SETTINGS)), 7)  # norm gains too
    tokens = torch.randint(0, 23, (2, 6), generator=torch.Generator().manual_seed(8))
    assert_processing_keeps_the_log_probs(model, tokens)


def test_lightning_generation_reruns_the_prefix() -> None:
    prompt = torch.randint(0, 23, (2, 4), generator=torch.Generator().manual_seed(9))
    assert_generation_reruns_the_prefix(_hybrid(), prompt)


def test_a_normed_skip_hybrid_saves_and_loads(tmp_path) -> None:
    model = _hybrid(normed_skip=True, attn_skip_scale=1.5, mlp_skip_scale=0.5)
    tokens = torch.randint(0, 23, (1, 6), generator=torch.Generator().manual_seed(10))
    loaded = assert_saves_and_loads(model, tmp_path / "hybrid", tokens)
    assert loaded.cfg.mixers.layers == KINDS


def test_the_normed_skip_block_is_its_equations() -> None:
    model = _hybrid(normed_skip=True, attn_skip_scale=1.5, mlp_skip_scale=0.5)
    tokens = torch.randint(0, 23, (2, 6), generator=torch.Generator().manual_seed(11))
    _, cache = model.run_with_cache(tokens)
    for i, block in enumerate(model.blocks):
        b = f"blocks.{i}"
        mid = 1.5 * block.ln1(cache[f"{b}.hook_resid_pre"]) + cache[f"{b}.hook_attn_out"]
        torch.testing.assert_close(cache[f"{b}.hook_resid_mid"], mid, rtol=0, atol=1e-12)
        post = 0.5 * block.ln2(mid) + cache[f"{b}.hook_mlp_out"]
        torch.testing.assert_close(cache[f"{b}.hook_resid_post"], post, rtol=0, atol=1e-12)


def test_skip_scales_without_normed_skips_are_refused() -> None:
    with pytest.raises(ValueError, match="they need normed_skip=True"):
        dataclasses.replace(hybrid_cfg(KINDS, **SETTINGS), attn_skip_scale=2.0)
