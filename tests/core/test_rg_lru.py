"""Griffin's recurrent block (`RGLRUMixer`), against its recurrence written here channel by
channel and position by position in float64; and a hybrid model holding one: causality,
padding (the reset at each row's first real token), the residual decomposition summing,
weight processing, generation, saving and loading."""

import math

import pytest
import torch
from helpers.decomposition import assert_decomposition_sums_in
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

from hookedattn import HookedTransformer
from hookedattn.core.components.rg_lru import RGLRUMixer

KINDS = ("rg_lru", "attention", "rg_lru")


def _gelu_tanh(v: float) -> float:
    return 0.5 * v * (1 + math.tanh(math.sqrt(2 / math.pi) * (v + 0.044715 * v**3)))


def _by_recurrence(mixer: RGLRUMixer, x: torch.Tensor) -> torch.Tensor:
    """`h_t = a_t h_{t-1} + sqrt(1 - a_t^2) i_t u_t` (`h_0 = i_0 u_0`), each channel and
    position in turn; then `(h * gelu_tanh(x W_y + b_y)) W_out + b_out`."""
    batch, n_pos, _ = x.shape
    d_inner, K = mixer.W_conv.shape
    P = mixer.W_a.shape[1]
    pre = x @ mixer.W_x + mixer.b_x
    y = x @ mixer.W_y + mixer.b_y
    h = torch.zeros(batch, d_inner, dtype=x.dtype)
    out = torch.zeros(batch, n_pos, D_MODEL, dtype=x.dtype)
    for t in range(n_pos):
        u = mixer.b_conv.expand(batch, -1).clone()
        for tap in range(K):
            if t - (K - 1) + tap >= 0:
                u = u + mixer.W_conv[:, tap] * pre[:, t - (K - 1) + tap]
        written = torch.zeros(batch, d_inner, dtype=x.dtype)
        for b in range(batch):
            for c in range(d_inner):
                head, within = divmod(c, P)
                block = u[b, head * P : (head + 1) * P]
                r = torch.sigmoid(block @ mixer.W_a[head, :, within] + mixer.b_a[c])
                i = torch.sigmoid(block @ mixer.W_i[head, :, within] + mixer.b_i[c])
                a = torch.exp(-8 * r * torch.log1p(torch.exp(mixer.Lambda[c])))
                scale = 1.0 if t == 0 else torch.sqrt(1 - a * a)
                h[b, c] = (0.0 if t == 0 else a * h[b, c]) + scale * i * u[b, c]
                written[b, c] = h[b, c] * _gelu_tanh(float(y[b, t, c]))
        out[:, t] = written @ mixer.W_out + mixer.b_out
    return out


def test_rg_lru_is_its_recurrence() -> None:
    mixer = randomised(RGLRUMixer(hybrid_cfg(("rg_lru",))), 1)
    x = torch.randn(2, 9, D_MODEL, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        got, expected = mixer(x, unpadded_context(x)), _by_recurrence(mixer, x)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12 * float(expected.abs().max()))


def test_rg_lru_is_causal_and_float32_close() -> None:
    mixer = randomised(RGLRUMixer(hybrid_cfg(("rg_lru",))), 3)
    single = RGLRUMixer(hybrid_cfg(("rg_lru",), dtype=torch.float32))
    x = torch.randn(1, 10, D_MODEL, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    with torch.no_grad():
        assert_causal_and_float32_close(mixer, single, x)


def _hybrid(**mixer) -> HookedTransformer:
    return random_hybrid(hybrid_cfg(KINDS, **mixer), 5)


def test_rg_lru_hook_points_and_decomposition_sum() -> None:
    model = _hybrid()
    tokens = torch.randint(0, 23, (2, 8), generator=torch.Generator().manual_seed(6))
    _, cache = model.run_with_cache(tokens)
    a, h = cache["blocks.0.mixer.hook_decay"], cache["blocks.0.mixer.hook_state"]
    assert a.shape == h.shape == (2, 8, 24)
    assert bool(((a > 0) & (a < 1)).all())
    decompositions = assert_decomposition_sums_in(model, cache, ("sublayer", "head", "neuron"))
    assert "L0_rg_lru" in decompositions["head"].labels


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_reaches_no_real_token_and_the_first_real_one_resets(side: str) -> None:
    assert_padding_reaches_no_real_token(_hybrid(), side)


def test_rg_lru_weight_processing_keeps_the_log_probs() -> None:
    model = randomised(HookedTransformer(hybrid_cfg(KINDS)), 7)  # norm gains too
    tokens = torch.randint(0, 23, (2, 6), generator=torch.Generator().manual_seed(8))
    processed = assert_processing_keeps_the_log_probs(model, tokens)
    assert processed.cfg.normalization_type == "RMSPre"


def test_rg_lru_generation_reruns_the_prefix() -> None:
    prompt = torch.randint(0, 23, (2, 4), generator=torch.Generator().manual_seed(9))
    assert_generation_reruns_the_prefix(_hybrid(), prompt)


def test_an_rg_lru_hybrid_saves_and_loads(tmp_path) -> None:
    model = _hybrid()
    tokens = torch.randint(0, 23, (1, 6), generator=torch.Generator().manual_seed(10))
    loaded = assert_saves_and_loads(model, tmp_path / "hybrid", tokens)
    assert loaded.cfg.mixers.layers == KINDS
