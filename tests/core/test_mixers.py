"""The hybrid models' mixers (`ShortConv`, `Mamba2Mixer`, `causal_conv`), each against a
brute-force reference written here position by position (the recurrence itself for
Mamba-2), in float64; and a hybrid model's wiring: hook points, the residual decomposition
summing, errors where an analysis needs heads."""

import math

import pytest
import torch
from helpers.decomposition import assert_decomposition_sums_in
from helpers.mixers import (
    D_MODEL,
    assert_causal_and_float32_close,
    assert_padding_reaches_no_real_token,
    hybrid_cfg,
    random_hybrid,
    randomised,
    unpadded_context,
)
from helpers.saving import assert_saves_and_loads

from hookedattn import HookedTransformer
from hookedattn.core.components.causal_conv import causal_conv
from hookedattn.core.components.mamba2 import Mamba2Mixer
from hookedattn.core.components.short_conv import ShortConv


def test_causal_conv_is_the_windowed_sum() -> None:
    g = torch.Generator().manual_seed(0)
    u, W, b = (torch.randn(s, generator=g, dtype=torch.float64) for s in ((2, 7, 5), (5, 4), (5,)))
    expected = torch.zeros_like(u)
    for t in range(7):
        for k in range(4):  # tap k reads position t - 3 + k
            if t - 3 + k >= 0:
                expected[:, t] += W[:, k] * u[:, t - 3 + k]
    torch.testing.assert_close(causal_conv(u, W, b), expected + b, rtol=0, atol=1e-14)


def test_short_conv_matches_its_loop() -> None:
    conv = randomised(ShortConv(hybrid_cfg(("short_conv",))), 1)
    x = torch.randn(2, 9, D_MODEL, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    expected = torch.zeros_like(x)
    for t in range(9):
        y = torch.zeros(2, D_MODEL, dtype=torch.float64)
        for k in range(3):
            s = t - 2 + k
            if s >= 0:
                b, h = x[:, s] @ conv.W_B + conv.b_B, x[:, s] @ conv.W_X + conv.b_X
                y += conv.W_conv[:, k] * b * h
        c = x[:, t] @ conv.W_C + conv.b_C
        expected[:, t] = (c * (y + conv.b_conv)) @ conv.W_out + conv.b_out
    torch.testing.assert_close(conv(x, unpadded_context(x)), expected, rtol=0, atol=1e-12)


def _mamba2_by_recurrence(mixer: Mamba2Mixer, x: torch.Tensor) -> torch.Tensor:
    """The Mamba-2 recurrence run position by position: `S_t = exp(dt_t A) S_{t-1} + dt_t
    xs_t B_t^T`, `y_t = S_t C_t + D xs_t`; then the gated RMSNorm per group."""
    m = mixer.settings
    H, P, G, N = m.n_ssm_heads, m.d_ssm_head, m.n_ssm_groups, m.d_state
    batch, n_pos, _ = x.shape
    pre = x @ mixer.W_xBC + mixer.b_xBC
    K = m.d_conv
    out = torch.zeros(batch, n_pos, D_MODEL, dtype=x.dtype)
    state = torch.zeros(batch, H, P, N, dtype=x.dtype)
    A = -torch.exp(mixer.A_log)
    for t in range(n_pos):
        u = mixer.b_conv.expand(batch, -1).clone()
        for k in range(K):
            if t - (K - 1) + k >= 0:
                u = u + mixer.W_conv[:, k] * pre[:, t - (K - 1) + k]
        u = torch.nn.functional.silu(u)
        xs = u[:, : H * P].reshape(batch, H, P)
        B = u[:, H * P : H * P + G * N].reshape(batch, G, N)
        C = u[:, H * P + G * N :].reshape(batch, G, N)
        dt = torch.nn.functional.softplus(x[:, t] @ mixer.W_dt + mixer.b_dt + mixer.dt_bias)
        dt = dt.clamp(m.dt_min, m.dt_max)
        y = torch.zeros(batch, H, P, dtype=x.dtype)
        for h in range(H):
            g = h // (H // G)
            decay = torch.exp(dt[:, h] * A[h])[:, None, None]
            state[:, h] = (
                decay * state[:, h] + dt[:, h, None, None] * xs[:, h, :, None] * B[:, g, None, :]
            )
            y[:, h] = (state[:, h] @ C[:, g, :, None])[..., 0] + mixer.D[h] * xs[:, h]
        z = x[:, t] @ mixer.W_z + mixer.b_z
        gated = y.reshape(batch, H * P) * torch.nn.functional.silu(z)
        if not m.ssm_gated_norm:  # Falcon-H1's default: no norm
            out[:, t] = gated @ mixer.W_out + mixer.b_out
            continue
        groups = gated.reshape(batch, G, -1)
        normed = groups / torch.sqrt(groups.pow(2).mean(-1, keepdim=True) + m.ssm_norm_eps)
        out[:, t] = (normed.reshape(batch, -1) * mixer.w_norm) @ mixer.W_out + mixer.b_out
    return out


@pytest.mark.parametrize(
    "groups, dt_max, normed", [(2, math.inf, True), (1, 0.7, True), (4, math.inf, True),
                               (2, math.inf, False)]
)  # fmt: skip
def test_mamba2_mixing_is_the_recurrence(groups: int, dt_max: float, normed: bool) -> None:
    cfg = hybrid_cfg(("mamba2",), n_ssm_groups=groups, dt_max=dt_max, ssm_gated_norm=normed)
    mixer = randomised(Mamba2Mixer(cfg), 3)
    assert hasattr(mixer, "w_norm") == normed
    x = torch.randn(2, 11, D_MODEL, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    torch.testing.assert_close(
        mixer(x, unpadded_context(x)), _mamba2_by_recurrence(mixer, x), rtol=0, atol=1e-10
    )


def test_mamba2_over_several_runs_is_the_recurrence() -> None:
    """150 positions: three runs of the SSD's chunked form (`ssd_rule`), each from the state
    the one before left."""
    mixer = randomised(Mamba2Mixer(hybrid_cfg(("mamba2",))), 21)
    x = torch.randn(
        1, 150, D_MODEL, generator=torch.Generator().manual_seed(22), dtype=torch.float64
    )
    expected = _mamba2_by_recurrence(mixer, x)
    with torch.no_grad():
        got = mixer(x, unpadded_context(x))
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12 * float(expected.abs().max()))


def test_mamba2_written_out_and_by_its_state_agree() -> None:
    """Unread, the mixer runs `ssd_rule` (runs of 64 positions, no mixing matrix over all
    100); read, it forms `M`."""
    mixer = randomised(Mamba2Mixer(hybrid_cfg(("mamba2",))), 23)
    x = torch.randn(
        2, 100, D_MODEL, generator=torch.Generator().manual_seed(24), dtype=torch.float64
    )
    with torch.no_grad():
        by_state = mixer(x, unpadded_context(x))
        handle = mixer.hook_mixing.add_hook(lambda value, hook: value)
        written_out = mixer(x, unpadded_context(x))
        handle.remove()
    scale = float(written_out.abs().max())
    torch.testing.assert_close(by_state, written_out, rtol=0, atol=1e-12 * scale)
    assert not torch.equal(by_state, written_out)  # two computations, not one


@pytest.mark.parametrize("chunk", [1, 4, 13])
def test_the_ssd_in_runs_is_the_ssd_over_the_whole(chunk: int) -> None:
    """`ssd_rule`'s runs, each from the state the one before left, padding included: the
    reads and the state of one `ssd_chunk` over every position."""
    from hookedattn.core.components.mamba2 import ssd_chunk, ssd_rule

    generator = torch.Generator().manual_seed(25)
    draw = lambda *shape: torch.randn(*shape, generator=generator, dtype=torch.float64)
    xs, dt, A = (
        draw(2, 13, 4, 6),
        torch.rand(2, 13, 4, generator=generator, dtype=torch.float64),
        -draw(4).abs(),
    )
    B, C, state = draw(2, 13, 2, 5), draw(2, 13, 2, 5), draw(2, 4, 6, 5)
    real = torch.ones(2, 13, 1, dtype=torch.bool)
    real[0, :3] = False  # a left-padded row
    whole, whole_state = ssd_chunk(xs, dt, A, B, C, real, state)
    runs, runs_state = ssd_rule(xs, dt, A, B, C, real, state, chunk=chunk)
    torch.testing.assert_close(runs, whole, rtol=0, atol=1e-12 * float(whole.abs().max()))
    scale = float(whole_state.abs().max())
    torch.testing.assert_close(runs_state, whole_state, rtol=0, atol=1e-12 * scale)


def test_mamba2_mixing_is_causal_and_float32_close() -> None:
    mixer = randomised(Mamba2Mixer(hybrid_cfg(("mamba2",))), 5)
    x = torch.randn(1, 10, D_MODEL, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    single = Mamba2Mixer(hybrid_cfg(("mamba2",), dtype=torch.float32))
    assert_causal_and_float32_close(mixer, single, x)


def _hybrid(dtype: torch.dtype = torch.float64) -> HookedTransformer:
    return random_hybrid(hybrid_cfg(("short_conv", "attention", "mamba2"), dtype=dtype), 7)


def test_hybrid_hook_points_and_decomposition_sum() -> None:
    model = _hybrid()
    tokens = torch.randint(0, 23, (2, 8), generator=torch.Generator().manual_seed(8))
    _, cache = model.run_with_cache(tokens)
    for name in ("blocks.0.mixer.hook_in", "blocks.0.mixer.hook_conv", "blocks.0.mixer.hook_out",
                 "blocks.1.attn.hook_pattern", "blocks.2.mixer.hook_mixing",
                 "blocks.2.hook_attn_out"):  # fmt: skip
        assert name in cache
    decompositions = assert_decomposition_sums_in(model, cache, ("sublayer", "head", "neuron"))
    heads = decompositions["head"].labels
    assert "L0_short_conv" in heads and "L2_mamba2" in heads and "L1H2" in heads
    assert not any(label.startswith(("L0H", "L2H")) for label in heads)


def test_what_needs_heads_refuses_mixer_layers_by_name() -> None:
    from analysis.head_results import head_results

    model = _hybrid()
    tokens = torch.randint(0, 23, (1, 5), generator=torch.Generator().manual_seed(9))
    _, cache = model.run_with_cache(tokens)
    with pytest.raises(ValueError, match=r"blocks \[2\] hold \['mamba2'\]"):
        head_results(model, cache, 2)
    assert head_results(model, cache, 1).shape == (1, 5, 3, D_MODEL)
    with pytest.raises(ValueError, match=r"blocks \[0, 2\] hold \['mamba2', 'short_conv'\]"):
        _ = model.W_Q


def test_hybrid_generation_without_the_cache_reruns_the_prefix() -> None:
    model = _hybrid()
    prompt = torch.randint(0, 23, (2, 4), generator=torch.Generator().manual_seed(10))
    generated = model.generate(prompt, max_new_tokens=5, stop_at_eos=False, use_past_kv_cache=False)
    tokens = prompt
    for _ in range(5):  # greedy, each step a plain forward of the whole sequence
        tokens = torch.cat([tokens, model(tokens)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(generated, tokens)


@pytest.mark.parametrize("norm", ["RMS", "LN"])
def test_hybrid_weight_processing_keeps_the_log_probs(norm: str) -> None:
    from hookedattn.core import processing

    cfg = hybrid_cfg(("short_conv", "attention", "mamba2")).replace(
        normalization_type=norm, gated_mlp=norm == "RMS"
    )
    model = randomised(HookedTransformer(cfg), 11)  # norm gains and biases too
    tokens = torch.randint(0, 23, (2, 6), generator=torch.Generator().manual_seed(12))
    processed = processing.process_weights(model)
    assert processed.cfg.normalization_type == f"{norm}Pre"
    expected = model(tokens).log_softmax(-1)
    torch.testing.assert_close(processed(tokens).log_softmax(-1), expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_reaches_no_real_token_of_a_hybrid(side: str) -> None:
    assert_padding_reaches_no_real_token(_hybrid(), side)


def test_tensor_parallel_splits_a_hybrids_attention_mlps_and_these_mixers():
    # The runs on two ranks: tests/parallel/test_tensor_parallel.py (slow).
    from hookedattn.core.parallel import _styles, check_tp_size

    cfg = hybrid_cfg(("short_conv", "attention", "mamba2", "gated_delta"))
    assert check_tp_size(cfg, 3) == 3
    plan = {path: type(style).__name__ for path, style in _styles.tensor_parallel_plan(cfg).items()}
    mlps = {f"blocks.{layer}.mlp": "NeuronParallel" for layer in range(4)}
    attention = {"blocks.1": "HeadParallelInputs", "blocks.1.attn": "HeadParallel"}
    vocabulary = {"embed": "VocabParallel", "unembed": "VocabParallel"}
    # The short convolution by channels, Mamba-2 and the gated delta net by heads.
    mixers = {f"blocks.{layer}.mixer": "MixerParallel" for layer in (0, 2, 3)}
    assert plan == mlps | attention | vocabulary | mixers


@pytest.mark.parametrize(
    ("heads", "groups", "tp_size", "splits"),
    [(4, 2, 2, True), (4, 1, 2, True), (4, 1, 4, True), (4, 2, 4, False), (3, 1, 2, False)],
)
def test_a_mamba2_mixer_splits_where_its_heads_divide_and_its_groups_divide_or_are_one(
    heads: int, groups: int, tp_size: int, splits: bool
) -> None:
    # Two groups over four ranks would put a group's norm on two of them: run whole.
    from hookedattn.core.parallel._mixers import splits_heads

    mixer = Mamba2Mixer(hybrid_cfg(("mamba2",), n_ssm_heads=heads, n_ssm_groups=groups))
    assert splits_heads(mixer, tp_size) is splits


def test_a_hybrid_saves_and_loads(tmp_path) -> None:
    model = HookedTransformer(hybrid_cfg(("mamba2", "attention", "short_conv")))
    randomised(model, 13)
    tokens = torch.randint(0, 23, (1, 6), generator=torch.Generator().manual_seed(14))
    assert_saves_and_loads(model, tmp_path / "hybrid", tokens)


def test_a_fresh_hybrid_writes_through_its_mixers() -> None:
    model = HookedTransformer(hybrid_cfg(("mamba2", "attention", "short_conv")))
    assert torch.equal(model.blocks[0].mixer.w_norm, torch.ones_like(model.blocks[0].mixer.w_norm))
    tokens = torch.randint(0, 23, (1, 6), generator=torch.Generator().manual_seed(15))
    _, cache = model.run_with_cache(tokens)
    for layer in (0, 2):
        assert float(cache[f"blocks.{layer}.hook_attn_out"].abs().max()) > 0


def test_analyses_of_one_blocks_heads_refuse_a_mixer_block_by_name() -> None:
    from analysis import qk_attribution

    model = _hybrid()
    tokens = torch.randint(0, 23, (1, 5), generator=torch.Generator().manual_seed(16))
    _, cache = model.run_with_cache(tokens)
    with pytest.raises(ValueError, match=r"qk_attribution of layer 2 needs attention heads"):
        qk_attribution(model, cache, 2, 0, 4, 1)
