"""apply_ln_to_stack: normalised components sum exactly to the norm's cached output."""

import itertools

import pytest
import torch

from analysis import (
    DecompositionError,
    accumulated_resid,
    apply_ln_to_stack,
    decompose_resid,
)
from analysis.normalization import NormSite, normalize
from hookedattn import ActivationCache
from hookedattn.core.tolerances import tolerance
from hookedattn.testing import random_tiny_model

NORMS = ("LN", "LNPre", "RMS", "RMSPre")


def _model(norm="LN", attn_only=False, dtype=torch.float64, **extra):
    """Every parameter random (`random_tiny_model`), gains and biases included."""
    sizes = dict(n_ctx=8, d_vocab=20, d_mlp=None if attn_only else 24)
    return random_tiny_model(
        **sizes, attn_only=attn_only, normalization_type=norm, dtype=dtype, **extra
    )


def _run(model):
    tokens = torch.randint(0, 20, (2, 6), generator=torch.Generator().manual_seed(2))
    return model.run_with_cache(tokens)[1]


# (layer, site) of a stream, and the norm that reads it.
READERS = [
    (0, "resid_pre", "blocks.0.ln1"),
    (0, "resid_mid", "blocks.0.ln2"),
    (0, "resid_post", "blocks.1.ln1"),
    (1, "resid_mid", "blocks.1.ln2"),
    (None, "resid_pre", "ln_final"),
]


@pytest.mark.parametrize("dtype", (torch.float64, torch.float32))
@pytest.mark.parametrize("norm", NORMS)
def test_normalised_components_sum_to_the_norms_output(norm, dtype):
    model = _model(norm, dtype=dtype)
    cache = _run(model)
    for (layer, site, reader), granularity in itertools.product(READERS, ("head", "neuron")):
        decomp = decompose_resid(model, cache, layer, site, granularity)
        normalized = apply_ln_to_stack(model, cache, decomp, check=True)
        assert normalized.normalized_by == reader
        target = cache[f"{reader}.hook_out"]
        torch.testing.assert_close(normalized.sum(), target, **tolerance(dtype).as_kwargs())


def test_layernorm_component_is_centred_scaled_and_gained_with_the_bias_apart():
    model = _model("LN")
    cache = _run(model)
    decomp = decompose_resid(model, cache, granularity="head")
    normalized = apply_ln_to_stack(model, cache, decomp)
    ln = model.ln_final
    head = decomp["L1H2"]
    expected = (head - head.mean(-1, keepdim=True)) / cache["scale"] * ln.w.detach()
    torch.testing.assert_close(normalized["L1H2"], expected, rtol=1e-12, atol=1e-12)
    assert normalized.labels[-1] == "ln_final_bias"
    assert torch.equal(normalized["ln_final_bias"][1, 4], ln.b.detach())


def test_rmsnorm_components_are_not_centred():
    model = _model("RMS")
    cache = _run(model)
    decomp = decompose_resid(model, cache, 1, "resid_mid")
    normalized = apply_ln_to_stack(model, cache, decomp)
    expected = decomp["embed"] / cache["scale", 1, "ln2"] * model.blocks[1].ln2.w.detach()
    torch.testing.assert_close(normalized["embed"], expected, rtol=1e-12, atol=1e-12)
    assert normalized.labels == decomp.labels  # RMSNorm has no bias


def test_without_norms_the_components_are_unchanged():
    model = _model(None)
    cache = _run(model)
    decomp = decompose_resid(model, cache, granularity="neuron")
    normalized = apply_ln_to_stack(model, cache, decomp)
    assert torch.equal(normalized.components, decomp.components)
    assert normalized.normalized_by == "ln_final"


@pytest.mark.parametrize("per_head", ({"use_split_qkv_input": True}, {"use_attn_in": True}))
def test_blocks_with_per_head_inputs(per_head):
    model = _model("LN", **per_head)
    cache = _run(model)
    normalized = apply_ln_to_stack(model, cache, decompose_resid(model, cache, 1), check=True)
    torch.testing.assert_close(normalized.sum(), cache["blocks.1.ln1.hook_out"][:, :, 0])


def test_check_raises_when_the_scale_is_not_the_streams():
    model = _model("LN")
    cache = _run(model)
    activations = dict(cache.items())
    activations["ln_final.hook_scale"] = activations["ln_final.hook_scale"] * 1.01
    bad = ActivationCache(activations, n_layers=2)
    with pytest.raises(DecompositionError, match="through ln_final does not add up"):
        apply_ln_to_stack(model, bad, decompose_resid(model, bad), check=True)


@pytest.mark.parametrize("norm", (*NORMS, None))
def test_normalize_recomputes_the_modules_output(norm):
    model = _model(norm)
    cache = _run(model)
    out = normalize(model, NormSite("ln2", 1), cache["resid_mid", 1])
    target = cache["blocks.1.ln2.hook_out"] if norm else cache["resid_mid", 1]
    torch.testing.assert_close(out, target, rtol=1e-12, atol=1e-12)


def test_accumulated_resid_and_double_normalisation_are_refused():
    model = _model("LN")
    cache = _run(model)
    with pytest.raises(TypeError, match="logit_lens"):
        apply_ln_to_stack(model, cache, accumulated_resid(model, cache))
    once = apply_ln_to_stack(model, cache, decompose_resid(model, cache))
    with pytest.raises(ValueError, match="already"):
        apply_ln_to_stack(model, cache, once)
