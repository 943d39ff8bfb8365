"""Residual decomposition: the components add up to the cached stream, at every point."""

import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis import (
    AccumulatedResid,
    Decomposition,
    DecompositionError,
    accumulated_resid,
    decompose_resid,
    head_results,
)
from hookedattn import ActivationCache, HookedTransformer, HookedTransformerConfig
from hookedattn.core.tolerances import tolerance
from hookedattn.testing import random_tiny_model, randomize_parameters

VARIANTS = list(itertools.product(("LN", "RMS", None), (True, False), (True, False)))
DTYPES = (torch.float64, torch.float32)


def _model(norm="LN", attn_only=False, use_attn_result=False, dtype=torch.float64, **extra):
    """Every parameter random (`random_tiny_model`), so that no forgotten term can hide."""
    sizes = dict(n_ctx=8, d_vocab=20, d_mlp=None if attn_only else 24)
    flags = dict(attn_only=attn_only, use_attn_result=use_attn_result)
    return random_tiny_model(**sizes, **flags, normalization_type=norm, dtype=dtype, **extra)


def _run(model, batch=2, pos=6, seed=2):
    tokens = torch.randint(
        0, model.cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(seed)
    )
    _, cache = model.run_with_cache(tokens)
    return cache


def _points(model):
    """Every (layer, site) a stream can be decomposed at, with its cached hook name."""
    n = model.cfg.n_layers
    sites = (
        ("resid_pre", "resid_post")
        if model.cfg.attn_only
        else ("resid_pre", "resid_mid", "resid_post")
    )
    points = [(layer, site, f"blocks.{layer}.hook_{site}") for layer in range(n) for site in sites]
    return [*points, (None, "resid_pre", f"blocks.{n - 1}.hook_resid_post")]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("norm", "attn_only", "use_attn_result"), VARIANTS)
def test_components_sum_to_the_cached_stream_everywhere(norm, attn_only, use_attn_result, dtype):
    model = _model(norm, attn_only, use_attn_result, dtype)
    cache = _run(model)
    for (layer, site, name), granularity in itertools.product(
        _points(model), ("sublayer", "head", "neuron")
    ):
        decomp = decompose_resid(model, cache, layer, site, granularity, check=True)
        # Rounding of a sum is relative to its terms' sizes, not to the total (which
        # cancellation can make small).
        tol = tolerance(dtype)
        bound = tol.atol + tol.rtol * decomp.components.abs().sum(0)
        assert bool(((decomp.sum() - cache[name]).abs() <= bound).all()), (layer, site)


def test_labels_at_each_granularity():
    model = _model("LN", attn_only=False)
    cache = _run(model)
    heads0 = ["L0H0", "L0H1", "L0H2", "L0H3"]
    assert decompose_resid(model, cache, 1).labels == ("embed", "pos_embed", "L0_attn", "L0_mlp")
    assert decompose_resid(model, cache, 1, "resid_mid", "head").labels == (
        "embed", "pos_embed", *heads0, "L0_attn_bias", "L0_mlp",
        "L1H0", "L1H1", "L1H2", "L1H3", "L1_attn_bias",
    )  # fmt: skip
    neurons = decompose_resid(model, cache, 1, granularity="neuron").labels
    assert neurons == (
        "embed", "pos_embed", *heads0, "L0_attn_bias", *(f"L0N{i}" for i in range(24)),
        "L0_mlp_bias",
    )  # fmt: skip


def test_sublayer_components_are_the_cached_outputs():
    model = _model("LN")
    cache = _run(model)
    decomp = decompose_resid(model, cache)
    assert torch.equal(decomp["embed"], cache["hook_embed"])
    assert torch.equal(decomp["pos_embed"], cache["hook_pos_embed"])
    assert torch.equal(decomp["L1_attn"], cache["attn_out", 1])
    assert torch.equal(decomp["L1_mlp"], cache["mlp_out", 1])


def test_head_components_are_head_results_and_the_bias_is_b_O():
    model = _model("LN")
    cache = _run(model)
    decomp = decompose_resid(model, cache, granularity="head")
    assert torch.equal(decomp["L1H2"], head_results(model, cache, 1)[:, :, 2])
    bias = model.blocks[1].attn.b_O.detach()
    assert torch.equal(decomp["L1_attn_bias"], bias.expand(2, 6, 16))


def test_neuron_component_is_its_activation_times_its_output_row():
    model = _model("RMS")
    cache = _run(model)
    decomp = decompose_resid(model, cache, granularity="neuron")
    W_out = model.blocks[0].mlp.W_out.detach()
    for b, p in itertools.product(range(2), range(6)):
        expected = cache["post", 0][b, p, 7] * W_out[7]
        torch.testing.assert_close(decomp["L0N7"][b, p], expected, rtol=1e-12, atol=1e-12)
    assert torch.equal(decomp["L0_mlp_bias"][0, 0], model.blocks[0].mlp.b_out.detach())


def test_rotary_model_has_no_pos_embed_component():
    model = _model("LN", positional_embedding_type="rotary")
    cache = _run(model)
    decomp = decompose_resid(model, cache, granularity="head", check=True)
    assert "pos_embed" not in decomp
    assert decomp.labels[0] == "embed"


def test_check_raises_with_the_largest_error():
    model = _model("LN")
    cache = _run(model)
    corrupted = dict(cache.items())
    corrupted["blocks.0.hook_attn_out"] = corrupted["blocks.0.hook_attn_out"].clone()
    corrupted["blocks.0.hook_attn_out"][1, 3, 5] += 0.25
    bad = ActivationCache(corrupted, n_layers=2)
    decompose_resid(model, bad, 0, check=True)  # before layer 0's write: still adds up
    with pytest.raises(DecompositionError, match=r"largest error 0\.25.*batch 1, pos 3, d_model 5"):
        decompose_resid(model, bad, 1, check=True)


def test_a_float64_cache_of_a_float32_model_is_checked_at_float32_rounding():
    model = _model("LN", dtype=torch.float32)
    _, cache = model.run_with_cache(torch.arange(6)[None], dtype=torch.float64)
    decomp = decompose_resid(model, cache, granularity="neuron", check=True)
    assert decomp.components.dtype == torch.float64


def test_cache_without_batch_axis_reads_as_a_batch_of_one():
    model = _model("LN")
    tokens = torch.arange(5)[None]
    _, cache = model.run_with_cache(tokens, remove_batch_dim=True)
    decomp = decompose_resid(model, cache, granularity="neuron", check=True)
    assert decomp.components.shape[1:] == (1, 5, 16)


def test_accumulated_resid_entries_are_the_cached_streams():
    model = _model("LN")
    cache = _run(model)
    acc = accumulated_resid(model, cache, incl_mid=True)
    assert isinstance(acc, AccumulatedResid)
    assert acc.labels == ("L0_resid_pre", "L0_resid_mid", "L1_resid_pre", "L1_resid_mid", "final")
    assert torch.equal(acc["L1_resid_mid"], cache["resid_mid", 1])
    assert torch.equal(acc["final"], cache["resid_post", 1])
    # Consecutive entries differ by what the sublayers between them wrote.
    torch.testing.assert_close(acc["L1_resid_pre"] - acc["L0_resid_mid"], cache["mlp_out", 0])


def test_accumulated_resid_stops_at_resid_pre_of_layer():
    model = _model("LN", attn_only=True, n_layers=3)
    cache = _run(model)
    acc = accumulated_resid(model, cache, 2, incl_mid=True)
    assert acc.labels == ("L0_resid_pre", "L1_resid_pre", "L2_resid_pre")
    assert torch.equal(acc["L2_resid_pre"], cache["resid_pre", 2])


def test_unknown_label_names_the_closest():
    model = _model("LN")
    decomp = decompose_resid(model, _run(model), granularity="head")
    with pytest.raises(KeyError, match="L1H2"):
        decomp["L1H22"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"layer": 0, "site": "resid_mid", "attn_only": True}, "no resid_mid"),
        ({"layer": 5}, "layer must be"),
        ({"site": "resid_middle"}, "site must be"),
        ({"granularity": "heads"}, "granularity must be"),
    ],
)
def test_bad_points_are_refused(kwargs, message):
    model = _model("LN", attn_only=kwargs.pop("attn_only", False))
    with pytest.raises(ValueError, match=message):
        decompose_resid(model, _run(model), **kwargs)


def test_repr_and_top_are_readable():
    model = _model("LN")
    decomp = decompose_resid(model, _run(model), granularity="head")
    assert isinstance(decomp, Decomposition)
    text = repr(decomp)
    assert "blocks.1.hook_resid_post" in text and "14 ×" in text and "L1_mlp" in text
    top = decomp.top(3, batch=1, pos=2)
    norms = decomp.norms()[:, 1, 2]
    assert len(top) == 3
    assert top.column("label")[0] == decomp.labels[int(norms.argmax())]
    assert list(top.column("norm")) == sorted(top.column("norm"), reverse=True)
    assert len(decomp.to_table().rows) == len(decomp)


@st.composite
def _configs(draw):
    positional = draw(st.sampled_from(("standard", "rotary", "none")))
    d_head = draw(st.sampled_from((2, 4) if positional == "rotary" else (1, 2, 3)))
    attn_only = draw(st.booleans())
    return HookedTransformerConfig(
        n_layers=draw(st.integers(1, 3)),
        d_model=draw(st.integers(2, 8)),
        n_heads=draw(st.integers(1, 3)),
        d_head=d_head,
        n_ctx=6,
        d_vocab=draw(st.integers(2, 12)),
        d_mlp=None if attn_only else draw(st.integers(1, 6)),
        attn_only=attn_only,
        act_fn=draw(st.sampled_from(("relu", "gelu", "gelu_new", "silu"))),
        normalization_type=draw(st.sampled_from((None, "LN", "LNPre", "RMS", "RMSPre"))),
        positional_embedding_type=positional,
        use_attn_result=draw(st.booleans()),
        dtype=torch.float64,
        seed=draw(st.integers(0, 1000)),
    )


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=_configs(), batch=st.integers(1, 2), pos=st.integers(1, 6), seed=st.integers(0, 99))
def test_full_decomposition_always_sums_to_the_final_stream(cfg, batch, pos, seed):
    model = randomize_parameters(HookedTransformer(cfg), seed=seed)
    tokens = torch.randint(
        0, cfg.d_vocab, (batch, pos), generator=torch.Generator().manual_seed(seed)
    )
    _, cache = model.run_with_cache(tokens)
    decomp = decompose_resid(model, cache, granularity="neuron")
    final = cache["resid_post", cfg.n_layers - 1]
    torch.testing.assert_close(decomp.sum(), final, rtol=1e-10, atol=1e-10)
