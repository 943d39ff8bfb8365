"""The gated delta net (`GatedDeltaNet`), against its recurrence written here position by
position in float64 (the state updated by the delta rule, no mixing matrix); and a hybrid
model holding one: causality, padding, the residual decomposition summing, weight
processing, generation, saving and loading."""

import pytest
import torch
from helpers.decomposition import assert_decomposition_sums_in
from helpers.mixers import (
    D_MODEL,
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
from hookedattn.core.components.gated_delta import GatedDeltaNet

KINDS = ("gated_delta", "attention", "gated_delta")


def _by_recurrence(mixer: GatedDeltaNet, x: torch.Tensor) -> torch.Tensor:
    """What the mixer writes, by `_recurrence`."""
    return _recurrence(mixer, x)[0]


def _state_by_recurrence(mixer: GatedDeltaNet, x: torch.Tensor) -> torch.Tensor:
    """The state after the last position, by `_recurrence`: `[batch head d_state d_head]`."""
    return _recurrence(mixer, x)[1]


def _recurrence(mixer: GatedDeltaNet, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T`,
    `o_t = S_t^T q_t`, run position by position; then the gated RMSNorm per head."""
    m = mixer.settings
    H, P, G, N, K = m.n_ssm_heads, m.d_ssm_head, m.n_ssm_groups, m.d_state, m.d_conv
    batch, n_pos, _ = x.shape
    pre = torch.cat([x @ getattr(mixer, f"W_{n}") + getattr(mixer, f"b_{n}") for n in "qkv"], -1)
    out = torch.zeros(batch, n_pos, D_MODEL, dtype=x.dtype)
    state = torch.zeros(batch, H, N, P, dtype=x.dtype)
    for t in range(n_pos):
        u = mixer.b_conv.expand(batch, -1).clone()
        for tap in range(K):
            if t - (K - 1) + tap >= 0:
                u = u + mixer.W_conv[:, tap] * pre[:, t - (K - 1) + tap]
        u = silu(u)
        q, k = u[:, : G * N].reshape(batch, G, N), u[:, G * N : 2 * G * N].reshape(batch, G, N)
        v = u[:, 2 * G * N :].reshape(batch, H, P)
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6) / N**0.5
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
        beta = m.delta_beta_scale * sigmoid(x[:, t] @ mixer.W_b + mixer.b_b)
        g = -torch.exp(mixer.A_log) * softplus(x[:, t] @ mixer.W_a + mixer.b_a + mixer.dt_bias)
        o = torch.zeros(batch, H, P, dtype=x.dtype)
        for h in range(H):
            kh, qh = k[:, h // (H // G)], q[:, h // (H // G)]
            decayed = torch.exp(g[:, h])[:, None, None] * state[:, h]
            remembered = (decayed * kh[:, :, None]).sum(1)  # S^T k
            written = beta[:, h, None] * (v[:, h] - remembered)
            state[:, h] = decayed + kh[:, :, None] * written[:, None, :]
            o[:, h] = (state[:, h] * qh[:, :, None]).sum(1)  # S^T q
        normed = o / torch.sqrt(o.pow(2).mean(-1, keepdim=True) + m.ssm_norm_eps)
        z = (x[:, t] @ mixer.W_z + mixer.b_z).reshape(batch, H, P)
        gated = (normed * mixer.w_norm * silu(z)).reshape(batch, H * P)
        out[:, t] = gated @ mixer.W_out + mixer.b_out
    return out, state


@pytest.mark.parametrize("groups, beta_scale", [(2, 1.0), (1, 2.0), (4, 1.0)])
def test_gated_delta_mixing_is_the_recurrence(groups: int, beta_scale: float) -> None:
    cfg = hybrid_cfg(("gated_delta",), n_ssm_groups=groups, delta_beta_scale=beta_scale)
    mixer = randomised(GatedDeltaNet(cfg), 3)
    x = torch.randn(2, 11, D_MODEL, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    with torch.no_grad():
        got, expected = mixer(x, unpadded_context(x)), _by_recurrence(mixer, x)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12 * float(expected.abs().max()))


def test_gated_delta_mixing_is_causal_and_float32_close() -> None:
    mixer = randomised(GatedDeltaNet(hybrid_cfg(("gated_delta",))), 5)
    x = torch.randn(1, 10, D_MODEL, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    changed = x.clone()
    changed[:, 6:] += 1.0
    with torch.no_grad():
        before, after = mixer(x, unpadded_context(x)), mixer(changed, unpadded_context(x))
        single = GatedDeltaNet(hybrid_cfg(("gated_delta",), dtype=torch.float32))
        single.load_state_dict({k: v.float() for k, v in mixer.state_dict().items()})
        got = single(x.float(), unpadded_context(x)).double()
    torch.testing.assert_close(after[:, :6], before[:, :6], rtol=0, atol=0)
    assert float((got - before).abs().max()) <= 1e-5 * float(before.abs().max())


def test_a_long_decay_is_summed_not_differenced() -> None:
    # Over 200 positions of strong decay the running total of g passes -1000: a decay taken
    # as the ratio exp(G_t) / exp(G_s) of running totals would be 0 / 0 there.
    mixer = randomised(GatedDeltaNet(hybrid_cfg(("gated_delta",))), 7)
    with torch.no_grad():
        mixer.A_log.fill_(3.0)
    generator = torch.Generator().manual_seed(8)
    x = torch.randn(1, 200, D_MODEL, generator=generator, dtype=torch.float64)
    with torch.no_grad():
        got, expected = mixer(x, unpadded_context(x)), _by_recurrence(mixer, x)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12 * float(expected.abs().max()))


def _hybrid(**mixer) -> HookedTransformer:
    return random_hybrid(hybrid_cfg(KINDS, **mixer), 9)


def test_gated_delta_hook_points_and_decomposition_sum() -> None:
    model = _hybrid()
    tokens = torch.randint(0, 23, (2, 8), generator=torch.Generator().manual_seed(10))
    _, cache = model.run_with_cache(tokens)
    assert cache["blocks.0.mixer.hook_mixing"].shape == (2, 4, 8, 8)
    for name in ("blocks.0.mixer.hook_in", "blocks.2.mixer.hook_out", "blocks.2.hook_attn_out"):
        assert name in cache
    decompositions = assert_decomposition_sums_in(model, cache, ("sublayer", "head", "neuron"))
    heads = decompositions["head"].labels
    assert "L0_gated_delta" in heads and "L1H2" in heads


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_reaches_no_real_token_of_a_gated_delta_hybrid(side: str) -> None:
    assert_padding_reaches_no_real_token(_hybrid(), side)


def test_gated_delta_weight_processing_keeps_the_log_probs() -> None:
    model = randomised(HookedTransformer(hybrid_cfg(KINDS)), 11)  # norm gains too
    tokens = torch.randint(0, 23, (2, 6), generator=torch.Generator().manual_seed(12))
    processed = assert_processing_keeps_the_log_probs(model, tokens)
    assert processed.cfg.normalization_type == "RMSPre"


def test_gated_delta_generation_reruns_the_prefix() -> None:
    prompt = torch.randint(0, 23, (2, 4), generator=torch.Generator().manual_seed(13))
    assert_generation_reruns_the_prefix(_hybrid(), prompt)


def test_a_gated_delta_hybrid_saves_and_loads(tmp_path) -> None:
    model = _hybrid(delta_beta_scale=2.0)  # a setting that must travel with the config
    tokens = torch.randint(0, 23, (1, 6), generator=torch.Generator().manual_seed(14))
    loaded = assert_saves_and_loads(model, tmp_path / "hybrid", tokens)
    assert loaded.cfg.mixers.layers == KINDS


def _read(value: torch.Tensor, hook) -> torch.Tensor:
    return value  # reading `hook_mixing` makes the mixer write the rule out


def test_the_rule_written_out_and_by_its_state_agree() -> None:
    """Unread, the mixer runs `delta_chunk` (no mixing matrix); read, it forms `M`."""
    mixer = randomised(GatedDeltaNet(hybrid_cfg(("gated_delta",))), 15)
    x = torch.randn(
        2, 13, D_MODEL, generator=torch.Generator().manual_seed(16), dtype=torch.float64
    )
    with torch.no_grad():
        by_state = mixer(x, unpadded_context(x))
        handle = mixer.hook_mixing.add_hook(_read)
        written_out = mixer(x, unpadded_context(x))
        handle.remove()
    scale = float(written_out.abs().max())
    torch.testing.assert_close(by_state, written_out, rtol=0, atol=1e-12 * scale)
    assert not torch.equal(by_state, written_out)  # two computations, not one


def test_the_state_a_cache_carries_is_the_recurrences() -> None:
    mixer = randomised(GatedDeltaNet(hybrid_cfg(("gated_delta",))), 18)
    x = torch.randn(1, 7, D_MODEL, generator=torch.Generator().manual_seed(19), dtype=torch.float64)
    from hookedattn.core.kv_cache import MixerCacheEntry

    entry = MixerCacheEntry()
    with torch.no_grad():
        mixer(x[:, :3], unpadded_context(x[:, :3]), entry)
        mixer(x[:, 3:], unpadded_context(x[:, 3:]), entry)
        expected = _state_by_recurrence(mixer, x)
    got = entry.carried("state")
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12 * float(expected.abs().max()))


@pytest.mark.parametrize("chunk", [1, 4, 13])
def test_the_rule_in_runs_is_the_rule_over_the_whole(chunk: int) -> None:
    """`delta_rule`'s runs, each from the state the one before left: the reads and the
    state of one `delta_chunk` over every position (one position a run: the recurrence)."""
    from hookedattn.core.components.gated_delta import delta_chunk, delta_rule

    generator = torch.Generator().manual_seed(20)
    draw = lambda *shape: torch.randn(*shape, generator=generator, dtype=torch.float64)
    unit = lambda u: u / u.norm(dim=-1, keepdim=True)
    q, k = unit(draw(2, 13, 2, 5)), unit(draw(2, 13, 2, 5))
    v, beta, g = draw(2, 13, 4, 6), torch.sigmoid(draw(2, 13, 4)), -draw(2, 13, 4).abs()
    state = draw(2, 4, 5, 6)
    whole, whole_state = delta_chunk(q, k, v, beta, g, state)
    runs, runs_state = delta_rule(q, k, v, beta, g, state, chunk=chunk)
    torch.testing.assert_close(runs, whole, rtol=0, atol=1e-12 * float(whole.abs().max()))
    torch.testing.assert_close(
        runs_state, whole_state, rtol=0, atol=1e-12 * float(whole_state.abs().max())
    )
