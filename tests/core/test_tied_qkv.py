"""The q/k/v parameters are views of the fused product's one weight (`kernels.FusedQKV.tie`):
an edit by any route is seen, and a parameter given other storage falls back to a copy."""

import copy

import pytest
import torch
from helpers.fused import VARIANTS, pair

from hookedattn import HookedTransformer

TOKENS = torch.randint(0, 29, (3, 11), generator=torch.Generator().manual_seed(5))
NAMES = ("W_Q", "b_Q", "_W_K", "_b_K", "_W_V", "_b_V")


def _tied_weight(model: HookedTransformer, layer: int = 0) -> torch.Tensor:
    return model.blocks[layer].attn.fused_qkv._tied[1]


def _shares_the_tied_weight(model: HookedTransformer) -> bool:
    attn = model.blocks[0].attn
    start = _tied_weight(model).data_ptr()
    end = start + _tied_weight(model).numel() * _tied_weight(model).element_size()
    return all(start <= getattr(attn, name).data_ptr() < end for name in ("W_Q", "_W_K"))


def test_the_parameters_are_views_of_the_product_s_weight():
    fused, _ = pair(VARIANTS["llama"], torch.float64)
    assert _shares_the_tied_weight(fused)


def test_an_edit_through_data_is_seen_by_the_next_forward():
    # `.data` bypasses the version counter: a kept copy could not see this edit.
    fused, written = pair(VARIANTS["llama"], torch.float64)
    with torch.no_grad():
        before = fused(TOKENS)
        for model in (fused, written):
            model.blocks[0].attn.W_Q.data[1] *= 3.0
            model.blocks[1].attn._b_V.data[0] += 0.25
        after = fused(TOKENS)
        expected = written(TOKENS)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, expected, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_a_parameter_given_other_storage_is_read_from_it(name):
    fused, written = pair(VARIANTS["llama"], torch.float64)
    with torch.no_grad():
        for model in (fused, written):
            param = getattr(model.blocks[0].attn, name)
            param.data = param.data.clone() + 0.125
        torch.testing.assert_close(fused(TOKENS), written(TOKENS), rtol=1e-10, atol=1e-10)


def test_tied_and_untied_weights_give_the_same_logits_bit_for_bit():
    fused, _ = pair(VARIANTS["gpt2"], torch.float32)
    untied = copy.deepcopy(fused)  # a deep copy clones each parameter on its own
    assert not _shares_the_tied_weight(untied)
    with torch.no_grad():
        assert torch.equal(fused(TOKENS), untied(TOKENS))


def test_moving_the_model_ties_the_moved_parameters_again():
    fused, _ = pair(VARIANTS["llama"], torch.float32)
    fused.to(torch.float64)
    assert _tied_weight(fused).dtype == torch.float64
    assert _shares_the_tied_weight(fused)


def test_a_recorded_gradient_reaches_each_tied_parameter():
    fused, _ = pair(VARIANTS["llama"], torch.float64)
    fused(TOKENS, return_type="loss").backward()
    attn = fused.blocks[0].attn
    assert all(getattr(attn, name).grad.abs().sum() > 0 for name in ("W_Q", "_W_K", "_W_V"))


def test_loading_a_state_dict_writes_into_the_tied_weight():
    fused, _ = pair(VARIANTS["llama"], torch.float64)
    other, _ = pair(VARIANTS["llama"], torch.float64)
    with torch.no_grad():
        for param in other.parameters():
            param.mul_(1.5)
    fused.load_state_dict(other.state_dict())
    assert _shares_the_tied_weight(fused)
    with torch.no_grad():
        torch.testing.assert_close(fused(TOKENS), other(TOKENS), rtol=0, atol=0)
