"""Weight processing on every family's block shape: the logits before and after, in float64.

What folds is checked by running both models (a gain folded into the wrong reader, or
left out of a grouped `_W_K`, changes the logits far beyond 1e-10 with the random gains of
tests/helpers/families.py); what cannot fold is refused by name.
"""

import pytest
import torch
from helpers.families import FAMILIES, TOKENS, family_model, family_run

from hookedattn import (
    center_unembed,
    center_writing_weights,
    fold_layer_norm,
    fold_value_biases,
    process_weights,
)
from hookedattn.core.components.norm import RMSNorm, RMSNormPre
from hookedattn.core.tolerances import tolerance
from hookedattn.testing import assert_residual_identities

TOL = tolerance(torch.float64).as_kwargs()
FOLDABLE = [name for name in FAMILIES if FAMILIES[name].get("normalization_placement") is None]


def _logits(model):
    with torch.no_grad():
        return model(TOKENS)


@pytest.mark.parametrize("name", FOLDABLE)
def test_fold_layer_norm_keeps_the_logits_and_empties_the_norms(name):
    model, logits, _ = family_run(name)
    folded = fold_layer_norm(model)
    torch.testing.assert_close(_logits(folded), logits, **TOL)
    block = folded.blocks[0]
    assert not hasattr(block.ln1, "w") and not hasattr(block.ln2, "w")
    if model.cfg.use_qk_norm:  # after the projection, so it keeps its gain
        assert type(block.attn.q_norm) is RMSNorm
        assert torch.equal(block.attn.q_norm.w, model.blocks[0].attn.q_norm.w)
    if model.cfg.normalization_type == "RMS":
        assert type(block.ln1) is RMSNormPre
    _, cache = folded.run_with_cache(TOKENS)
    assert_residual_identities(folded, cache)


@pytest.mark.parametrize(
    ("name", "overrides", "named"),
    [
        ("gemma2", {}, "normalization_placement='pre_and_post'"),
        ("olmo2", {}, "normalization_placement='post'"),
        ("llama", {"normalization_type": "LN"}, "W_gate"),
    ],
)
def test_fold_layer_norm_refuses_what_no_weight_can_absorb(name, overrides, named):
    model = family_model(name, **overrides)
    with pytest.raises(ValueError, match=named):
        fold_layer_norm(model)


@pytest.mark.parametrize("name", FAMILIES)
def test_fold_value_biases_keeps_the_logits_and_the_attention_output(name):
    model, logits, cache = family_run(name)
    folded = fold_value_biases(model)
    new_logits, new_cache = folded.run_with_cache(TOKENS)
    torch.testing.assert_close(new_logits, logits, **TOL)
    torch.testing.assert_close(new_cache["attn_out", 1], cache["attn_out", 1], **TOL)
    assert not bool(folded.b_V.any())
    assert not torch.equal(folded.b_O, model.b_O)


def test_center_writing_weights_keeps_the_logits_of_a_parallel_layernorm_model():
    model, logits, _ = family_run("neox")
    centred = center_writing_weights(model)
    torch.testing.assert_close(_logits(centred), logits, **TOL)
    mean = centred.W_out.mean(-1)
    torch.testing.assert_close(mean, torch.zeros_like(mean), **TOL)


@pytest.mark.parametrize(
    ("name", "overrides", "named"),
    [
        ("llama", {}, "normalization_type='RMS'"),
        ("neox", {"normalization_placement": "pre_and_post"}, "normalization_placement"),
    ],
)
def test_center_writing_weights_refuses_where_a_reader_sees_the_mean(name, overrides, named):
    with pytest.raises(ValueError, match=named):
        center_writing_weights(family_model(name, **overrides))


@pytest.mark.parametrize("name", ["llama", "neox", "olmo2", "qwen3"])
def test_center_unembed_keeps_the_log_probabilities(name):
    model, logits, _ = family_run(name)
    new = _logits(center_unembed(model))
    torch.testing.assert_close(new.log_softmax(-1), logits.log_softmax(-1), **TOL)


def test_center_unembed_is_refused_under_a_logit_soft_cap():
    model, _, _ = family_run("gemma2")
    with pytest.raises(ValueError, match="output_logits_soft_cap=3"):
        center_unembed(model)


@pytest.mark.parametrize("name", FAMILIES)
def test_process_weights_applies_what_preserves_the_function(name):
    model, logits, _ = family_run(name)
    new = _logits(process_weights(model))
    torch.testing.assert_close(new.log_softmax(-1), logits.log_softmax(-1), **TOL)
    if model.cfg.output_logits_soft_cap is not None:  # center_unembed skipped: same logits
        torch.testing.assert_close(new, logits, **TOL)
