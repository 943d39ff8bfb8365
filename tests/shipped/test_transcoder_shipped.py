"""The transcoders shipped for bytes-gelu-2l: they load, fit their model, and met their bar."""

import pytest
import torch

from hookedattn import HookedTransformer
from hookedattn.sae import (
    CrossLayerTranscoder,
    evaluate_transcoders,
    list_pretrained_saes,
    list_pretrained_transcoders,
    load_pretrained_transcoders,
    pretrained_transcoders_record,
    replaced,
)
from hookedattn.training.corpus import heldout_windows, load_stdlib_corpus

KINDS = ["per_layer", "cross_layer"]


@pytest.fixture(scope="module")
def model():
    return HookedTransformer.from_pretrained("bytes-gelu-2l")


def test_both_kinds_are_listed_apart_from_the_saes():
    assert list_pretrained_transcoders() == [
        ("bytes-gelu-2l", k) for k in ("cross_layer", "per_layer")
    ]
    assert all(model != "bytes-gelu-2l" for model, _ in list_pretrained_saes())


@pytest.mark.parametrize("kind", KINDS)
def test_the_record_says_how_they_were_made_and_that_the_bar_was_met(kind):
    record = pretrained_transcoders_record("bytes-gelu-2l", kind)
    assert record["command"].startswith("python scripts/train_transcoders.py")
    assert f"--kind {kind}" in record["command"]
    assert record["bar"] == {
        "fve_at_least": 0.8,
        "l0_below": 32,
        "ce_recovered_vs_mean_at_least": 0.8,
    }
    assert record["bar_met"] == {"0": True, "1": True}


@pytest.mark.parametrize("kind", KINDS)
def test_they_replace_the_mlps_exactly_and_predict_them_well(model, kind):
    tcs = load_pretrained_transcoders("bytes-gelu-2l", kind, model=model)
    assert isinstance(tcs, CrossLayerTranscoder) == (kind == "cross_layer")
    tokens = heldout_windows(load_stdlib_corpus().heldout, 4, 64)
    with torch.no_grad():
        expected = model(tokens)
        with replaced(model, tcs):
            logits = model(tokens)
    torch.testing.assert_close(logits, expected, rtol=1e-4, atol=1e-4)
    result = evaluate_transcoders(model, tcs, tokens)
    for layer in result.layers:  # a small sample: the bar's measures, loosely
        assert layer.fve > 0.8 and layer.l0 == 16.0


def test_they_refuse_other_weights(model):
    other = HookedTransformer.from_pretrained("bytes-attn-only-2l")
    with pytest.raises(ValueError, match="retrain them"):
        load_pretrained_transcoders("bytes-gelu-2l", "per_layer", model=other)
    with pytest.raises(KeyError, match="shipped: "):
        load_pretrained_transcoders("bytes-attn-only-2l")
