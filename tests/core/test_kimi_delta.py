"""Kimi Delta Attention (`KimiDeltaAttention`), against its recurrence written here head by
head and channel by channel in float64 (each key row of the state decayed by its own
channel's gate, then the delta rule); and a hybrid model holding one: causality, padding,
the residual decomposition summing, weight processing, generation, saving and loading.
Each test runs Kimi Linear's form (low-rank gates, softplus decay) and Bailing Hybrid's
(full-rank gates, the decay bounded by `kda_decay_bound`)."""

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
from torch.nn.functional import sigmoid, silu, softplus

from hookedattn import HookedTransformer
from hookedattn.core.components.kimi_delta import KimiDeltaAttention

KINDS = ("kimi_delta", "attention", "kimi_delta")
# Kimi Linear's form, and Bailing Hybrid's (its lower bound -5, as its default config).
FORMS = {"kimi": dict(dt_rank=3),
         "bailing": dict(kda_full_rank_gates=True, kda_decay_bound=-5.0)}  # fmt: skip


@pytest.fixture(params=list(FORMS))
def settings(request) -> dict:
    return FORMS[request.param]


def _gates(mixer: KimiDeltaAttention, x_t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The decay `g` and the output gate's input `z` at one position, `[batch (head chan)]`."""
    m = mixer.settings
    if m.kda_full_rank_gates:
        f, z = x_t @ mixer.W_f + mixer.b_f, x_t @ mixer.W_g + mixer.b_g
    else:
        f = (x_t @ mixer.W_f_down + mixer.b_f_down) @ mixer.W_f_up
        z = (x_t @ mixer.W_g_down + mixer.b_g_down) @ mixer.W_g_up
    u = (f + mixer.dt_bias).reshape(x_t.shape[0], m.n_ssm_heads, m.d_ssm_head)
    A = torch.exp(mixer.A_log)[:, None]
    g = -A * softplus(u) if m.kda_decay_bound is None else m.kda_decay_bound * sigmoid(A * u)
    return g, z


def _by_recurrence(mixer: KimiDeltaAttention, x: torch.Tensor) -> torch.Tensor:
    """The state of each head updated row by row (key channel `c` decayed by
    `exp(g[c])`), then `S += k (beta (v - S^T k))^T`, `o = S^T q`; then the gated norm."""
    m = mixer.settings
    H, P, K = m.n_ssm_heads, m.d_ssm_head, m.d_conv
    batch, n_pos, _ = x.shape
    pre = torch.cat([x @ getattr(mixer, f"W_{n}") + getattr(mixer, f"b_{n}") for n in "qkv"], -1)
    state = torch.zeros(batch, H, P, P, dtype=x.dtype)
    out = torch.zeros(batch, n_pos, D_MODEL, dtype=x.dtype)
    for t in range(n_pos):
        u = mixer.b_conv.expand(batch, -1).clone()
        for tap in range(K):
            if t - (K - 1) + tap >= 0:
                u = u + mixer.W_conv[:, tap] * pre[:, t - (K - 1) + tap]
        q, k, v = (silu(part).reshape(batch, H, P) for part in u.split(H * P, dim=-1))
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) / P**0.5
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        g, z = _gates(mixer, x[:, t])
        beta = sigmoid(x[:, t] @ mixer.W_b + mixer.b_b)
        o = torch.zeros(batch, H, P, dtype=x.dtype)
        for b in range(batch):
            for h in range(H):
                for c in range(P):
                    state[b, h, c] = state[b, h, c] * torch.exp(g[b, h, c])
                remembered = sum(state[b, h, c] * k[b, h, c] for c in range(P))
                written = beta[b, h] * (v[b, h] - remembered)
                for c in range(P):
                    state[b, h, c] = state[b, h, c] + k[b, h, c] * written
                o[b, h] = sum(state[b, h, c] * q[b, h, c] for c in range(P))
        z = z.reshape(batch, H, P)
        normed = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + m.ssm_norm_eps)
        gated = (normed * mixer.w_norm * sigmoid(z)).reshape(batch, H * P)
        out[:, t] = gated @ mixer.W_out + mixer.b_out
    return out


def test_kimi_delta_is_its_recurrence(settings) -> None:
    mixer = randomised(KimiDeltaAttention(hybrid_cfg(("kimi_delta",), **settings)), 1)
    x = torch.randn(2, 9, D_MODEL, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        got, expected = mixer(x, unpadded_context(x)), _by_recurrence(mixer, x)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12 * float(expected.abs().max()))


def test_kimi_delta_is_causal_and_float32_close(settings) -> None:
    mixer = randomised(KimiDeltaAttention(hybrid_cfg(("kimi_delta",), **settings)), 3)
    single = KimiDeltaAttention(hybrid_cfg(("kimi_delta",), dtype=torch.float32, **settings))
    x = torch.randn(1, 10, D_MODEL, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    with torch.no_grad():
        assert_causal_and_float32_close(mixer, single, x)


def _hybrid(settings: dict) -> HookedTransformer:
    return random_hybrid(hybrid_cfg(KINDS, **settings), 5)


def test_kimi_delta_hook_points_and_decomposition_sum(settings) -> None:
    model = _hybrid(settings)
    tokens = torch.randint(0, 23, (2, 8), generator=torch.Generator().manual_seed(6))
    _, cache = model.run_with_cache(tokens)
    assert cache["blocks.0.mixer.hook_decay"].shape == (2, 8, 4, 6)  # a decay per channel
    assert bool((cache["blocks.0.mixer.hook_decay"] < 0).all())
    assert cache["blocks.2.mixer.hook_o"].shape == (2, 8, 4, 6)
    decompositions = assert_decomposition_sums_in(model, cache, ("sublayer", "head", "neuron"))
    assert "L0_kimi_delta" in decompositions["head"].labels


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_reaches_no_real_token_of_a_kimi_delta_hybrid(side: str, settings) -> None:
    assert_padding_reaches_no_real_token(_hybrid(settings), side)


def test_kimi_delta_weight_processing_keeps_the_log_probs(settings) -> None:
    model = randomised(HookedTransformer(hybrid_cfg(KINDS, **settings)), 7)  # norm gains too
    tokens = torch.randint(0, 23, (2, 6), generator=torch.Generator().manual_seed(8))
    assert_processing_keeps_the_log_probs(model, tokens)


def test_kimi_delta_generation_reruns_the_prefix(settings) -> None:
    prompt = torch.randint(0, 23, (2, 4), generator=torch.Generator().manual_seed(9))
    assert_generation_reruns_the_prefix(_hybrid(settings), prompt)


def test_a_kimi_delta_hybrid_saves_and_loads(tmp_path, settings) -> None:
    model = _hybrid(settings)
    tokens = torch.randint(0, 23, (1, 6), generator=torch.Generator().manual_seed(10))
    loaded = assert_saves_and_loads(model, tmp_path / "hybrid", tokens)
    assert loaded.cfg.mixers.layers == KINDS


def test_the_bounded_decay_keeps_at_least_its_bound() -> None:
    model = _hybrid(FORMS["bailing"])
    tokens = torch.randint(0, 23, (2, 8), generator=torch.Generator().manual_seed(11))
    decay = model.run_with_cache(tokens)[1]["blocks.0.mixer.hook_decay"]
    assert bool((decay >= -5.0).all()) and bool((decay < 0).all())


def test_a_decay_bound_that_is_not_negative_is_refused() -> None:
    with pytest.raises(ValueError, match="kda_decay_bound must be negative"):
        hybrid_cfg(KINDS, kda_decay_bound=0.5)


@pytest.mark.parametrize(
    ("heads", "tp_size", "splits"), [(4, 2, True), (4, 4, True), (3, 2, False)]
)
def test_kimi_delta_splits_over_ranks_where_its_heads_divide(heads: int, tp_size: int, splits):
    # The runs on two ranks: tests/parallel/test_tensor_parallel.py (slow).
    from hookedattn.core.parallel._mixers import splits_heads

    settings = dict(n_ssm_heads=heads, n_ssm_groups=1, d_ssm_head=4, dt_rank=3)
    mixer = _hybrid(settings).blocks[0].mixer
    assert splits_heads(mixer, tp_size) is splits
