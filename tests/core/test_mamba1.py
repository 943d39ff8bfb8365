"""The Mamba-1 mixer (`MambaMixer`, `selective_scan`): against the recurrence written here
channel by channel and position by position, and the scan against the unrolled mixing
matrix built densely, in float64; causal, blind to padding, summing in the residual
decomposition, saved and loaded; and, imported from tiny Mamba, Falcon Mamba and Jamba
twins, each mixer module against `transformers`' (whose scan runs in float32: to its
rounding)."""

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
from torch.nn.functional import silu, softplus

from hookedattn import HookedTransformer
from hookedattn.core.components.mamba import MambaMixer, selective_scan
from hookedattn.core.mixer_config import MixerConfig

D_INNER, D_STATE, DT_RANK = 10, 5, 3


def mamba_cfg(kinds: tuple[str, ...], dtype: torch.dtype = torch.float64, **mixer):
    """`hybrid_cfg` with Mamba-1's settings: each of `D_INNER` channels its own head."""
    mamba = dict(n_ssm_heads=D_INNER, d_ssm_head=1, n_ssm_groups=1, d_state=D_STATE,
                 dt_rank=DT_RANK)  # fmt: skip
    return hybrid_cfg(kinds, dtype, **mamba | mixer)


def _by_recurrence(mixer: MambaMixer, x: torch.Tensor, norms: bool) -> torch.Tensor:
    """The mixer written out one position and one channel at a time (module docstring of
    `components.mamba`), the RMSNorms by hand."""
    K, eps = mixer.W_conv.shape[1], mixer.norm_B.eps if norms else 0.0
    batch, n_pos, _ = x.shape
    rms = lambda v, w: (v / torch.sqrt(v.pow(2).mean(-1, keepdim=True) + eps) * w) if norms else v
    pre = x @ mixer.W_xs + mixer.b_xs
    h = torch.zeros(batch, D_INNER, D_STATE, dtype=x.dtype)
    out = torch.zeros(batch, n_pos, D_MODEL, dtype=x.dtype)
    for t in range(n_pos):
        u = mixer.b_conv.expand(batch, -1).clone()
        for k in range(K):  # tap k reads position t - (K - 1) + k
            if t - (K - 1) + k >= 0:
                u = u + mixer.W_conv[:, k] * pre[:, t - (K - 1) + k]
        xs = silu(u)
        B = rms(xs @ mixer.W_B, mixer.norm_B.w if norms else None)
        C = rms(xs @ mixer.W_C, mixer.norm_C.w if norms else None)
        low = rms(xs @ mixer.W_dt_down, mixer.norm_dt.w if norms else None)
        dt = softplus(low @ mixer.W_dt_up + mixer.b_dt)
        y = torch.zeros(batch, D_INNER, dtype=x.dtype)
        for c in range(D_INNER):
            A = -torch.exp(mixer.A_log[c])
            h[:, c] = torch.exp(dt[:, c, None] * A) * h[:, c] + (dt[:, c] * xs[:, c])[:, None] * B
            y[:, c] = (h[:, c] * C).sum(-1) + mixer.D[c] * xs[:, c]
        z = x[:, t] @ mixer.W_z + mixer.b_z
        out[:, t] = (y * silu(z)) @ mixer.W_out + mixer.b_out
    return out


@pytest.mark.parametrize("norms", [False, True])
def test_mamba_mixer_is_the_recurrence(norms: bool) -> None:
    mixer = randomised(MambaMixer(mamba_cfg(("mamba",), bcdt_norm=norms, ssm_norm_eps=1e-3)), 1)
    x = torch.randn(2, 11, D_MODEL, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    expected = _by_recurrence(mixer, x, norms)
    torch.testing.assert_close(mixer(x, unpadded_context(x)), expected, rtol=0, atol=1e-12)


def test_the_scan_is_the_unrolled_mixing_matrix() -> None:
    g = torch.Generator().manual_seed(3)
    n_pos = 9
    dt = softplus(torch.randn(2, n_pos, D_INNER, generator=g, dtype=torch.float64))
    A = -torch.rand(D_INNER, D_STATE, generator=g, dtype=torch.float64) * 2
    B, C = (torch.randn(2, n_pos, D_STATE, generator=g, dtype=torch.float64) for _ in "BC")
    xs = torch.randn(2, n_pos, D_INNER, generator=g, dtype=torch.float64)
    # M[c, t, s] = sum_n C_t[n] B_s[n] exp(sum_{r=s+1..t} dt_r[c] A[c, n]) dt_s[c], s <= t
    M = torch.zeros(2, D_INNER, n_pos, n_pos, dtype=torch.float64)
    for t in range(n_pos):
        for s in range(t + 1):
            rate = dt[:, s + 1 : t + 1, :, None].sum(1) * A  # [batch d_inner d_state]
            M[:, :, t, s] = (C[:, t, None] * B[:, s, None] * rate.exp()).sum(-1) * dt[:, s]
    expected = torch.einsum("bcts,bsc->btc", M, xs)
    got = torch.einsum("btcn,btn->btc", selective_scan(dt, A, B, xs), C)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_mamba_mixer_is_causal_and_float32_close() -> None:
    mixer = randomised(MambaMixer(mamba_cfg(("mamba",), bcdt_norm=True)), 4)
    x = torch.randn(1, 10, D_MODEL, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    single = MambaMixer(mamba_cfg(("mamba",), dtype=torch.float32, bcdt_norm=True))
    assert_causal_and_float32_close(mixer, single, x)


def test_a_mamba_mixer_needs_its_channels_as_heads() -> None:
    with pytest.raises(ValueError, match="needs d_ssm_head=1 and n_ssm_groups=1, got 2 and 1"):
        MixerConfig(layers=("mamba",), n_ssm_heads=4, d_ssm_head=2)


def _hybrid() -> HookedTransformer:
    return random_hybrid(mamba_cfg(("mamba", "attention", "mamba"), bcdt_norm=True), 6)


@pytest.mark.parametrize("side", ["left", "right"])
def test_padding_reaches_no_real_token_through_a_mamba_mixer(side: str) -> None:
    assert_padding_reaches_no_real_token(_hybrid(), side)


def test_mamba_hybrid_hook_points_and_decomposition_sum() -> None:
    model = _hybrid()
    tokens = torch.randint(0, 23, (2, 8), generator=torch.Generator().manual_seed(7))
    _, cache = model.run_with_cache(tokens)
    assert cache["blocks.0.mixer.hook_state"].shape == (2, 8, D_INNER, D_STATE)
    assert "blocks.2.mixer.hook_out" in cache and "blocks.1.attn.hook_pattern" in cache
    decompositions = assert_decomposition_sums_in(model, cache, ("sublayer", "head", "neuron"))
    heads = decompositions["head"].labels
    assert "L0_mamba" in heads and "L2_mamba" in heads and "L1H2" in heads


def test_a_mamba_hybrid_saves_and_loads(tmp_path) -> None:
    model = _hybrid()
    tokens = torch.randint(0, 23, (1, 6), generator=torch.Generator().manual_seed(8))
    loaded = assert_saves_and_loads(model, tmp_path / "hybrid", tokens)
    assert loaded.cfg.mixers.bcdt_norm


def test_a_fresh_mamba_mixer_has_unit_gains_and_writes() -> None:
    model = HookedTransformer(mamba_cfg(("mamba", "attention"), bcdt_norm=True))
    assert torch.equal(model.blocks[0].mixer.norm_B.w, torch.ones(D_STATE, dtype=torch.float64))
    _, cache = model.run_with_cache(torch.tensor([[1, 2, 3, 4]]))
    assert float(cache["blocks.0.hook_attn_out"].abs().max()) > 0


def _twin(model_type: str, **fields) -> torch.nn.Module:
    transformers = pytest.importorskip("transformers")
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    from hookedattn.core.hf import _tiny

    model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    config = _tiny.tiny_config(transformers.AutoConfig.for_model(model_type, **fields))
    return _tiny.random_hf_model(model_class, config, seed=9).double()


@pytest.mark.parametrize(
    "model_type, fields, norms",
    [("mamba", {}, False), ("falcon_mamba", {}, True), ("jamba", {"num_experts": 1}, True)],
)
def test_each_imported_mamba_mixer_is_the_transformers_module(model_type, fields, norms, tmp_path,
                                                              monkeypatch):  # fmt: skip
    monkeypatch.setenv("HOOKEDATTN_CACHE", str(tmp_path / "cache"))
    reference = _twin(model_type, **fields)
    model = HookedTransformer.from_hf(reference)
    assert model.cfg.mixers.layers[0] == "mamba" and model.cfg.mixers.bcdt_norm == norms
    theirs = (reference.model.layers[0].mamba if model_type == "jamba"
              else reference.backbone.layers[0].mixer)  # fmt: skip
    x = torch.randn(2, 9, model.cfg.d_model, generator=torch.Generator().manual_seed(10),
                    dtype=torch.float64)  # fmt: skip
    with torch.no_grad():
        want = theirs(x)
        got = model.blocks[0].mixer(x, unpadded_context(x))
    # transformers' scan reads its input in float32 (`hidden_states.float()`).
    assert float((got - want).abs().max()) <= 1e-6 * float(want.abs().max())


def test_a_mamba_anatomy_round_trips_through_the_memo(tmp_path, monkeypatch) -> None:
    from hookedattn.core.hf import _anatomy

    monkeypatch.setenv("HOOKEDATTN_CACHE", str(tmp_path / "cache"))
    config = _twin("jamba", num_experts=1).config
    first = _anatomy.recognise(config)  # read off the twin, then remembered
    again = _anatomy.recognise(config)  # read from the memo's JSON
    assert again == first and again.mixers.kind == "mamba" and again.mixers.norm_gains
    assert dict(again.mixers.settings)["n_ssm_heads"] == "mamba_expand*hidden_size"


@pytest.mark.parametrize(
    ("channels", "tp_size", "splits"), [(12, 2, True), (12, 4, True), (5, 2, False)]
)
def test_a_mamba_mixer_splits_over_ranks_where_its_channels_divide(channels, tp_size, splits):
    # The runs on two ranks: tests/parallel/test_tensor_parallel.py (slow).
    from hookedattn.core.parallel._mixers import splits_heads

    cfg = mamba_cfg(("mamba",), n_ssm_heads=channels)
    assert splits_heads(MambaMixer(cfg), tp_size) is splits


def test_a_model_of_mamba_mixers_alone_needs_no_heads_to_divide() -> None:
    # Falcon Mamba: no attention, so tp_size need not divide its (placeholder) heads.
    from hookedattn.core import parallel

    cfg = mamba_cfg(("mamba", "mamba"), n_ssm_heads=12)
    assert cfg.attention_layers == [] and parallel.check_tp_size(cfg, 4) == 4
