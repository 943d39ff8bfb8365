"""Inputs that used to give a raw error or a silently meaningless number: sampling settings,
text a tokenizer cannot read, and the loss of an input with nothing to predict."""

import math

import pytest
import torch

from hookedattn.core.generation import Sampling
from hookedattn.core.loss import lm_cross_entropy_loss
from hookedattn.core.tokenizers import ByteTokenizer, CharTokenizer
from hookedattn.testing import tiny_model


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", math.nan),
        ("temperature", -0.5),
        ("temperature", math.inf),
        ("top_p", 0.0),
        ("top_p", 1.5),
        ("top_p", math.nan),
    ],
)
def test_sampling_settings_out_of_range_are_refused_by_name(field, value):
    with pytest.raises(ValueError, match=f"{field} must be"):
        Sampling(do_sample=True, **{field: value})


def test_generate_refuses_a_nan_temperature_before_running():
    model = tiny_model(n_layers=1, d_model=8, n_heads=2, n_ctx=8, d_vocab=10, d_mlp=8)
    with pytest.raises(ValueError, match="temperature must be a number >= 0 and finite"):
        model.generate(
            torch.tensor([[1, 2]]), max_new_tokens=2, do_sample=True, temperature=math.nan
        )


def test_a_zero_temperature_still_means_greedy():
    assert Sampling(do_sample=True, temperature=0.0).greedy


def test_a_lone_surrogate_is_refused_naming_its_position():
    with pytest.raises(ValueError, match=r"'\\ud800' at position 2 .* lone surrogate"):
        ByteTokenizer().encode("ab\ud800c")
    assert ByteTokenizer().decode(ByteTokenizer().encode("ab\U0001f600c")) == "ab\U0001f600c"


def test_a_char_tokenizer_special_token_in_its_alphabet_is_refused():
    with pytest.raises(ValueError, match=r"special tokens \['#'\] are also characters"):
        CharTokenizer("ab#", bos_token="#")
    CharTokenizer("ab#", bos_token="<bos>")  # names outside the alphabet are fine


@pytest.mark.parametrize("mask", [None, torch.ones(2, 1, dtype=torch.long)])
def test_the_mean_loss_of_one_position_is_refused_with_or_without_a_mask(mask):
    logits, tokens = torch.randn(2, 1, 5), torch.tensor([[1], [2]])
    with pytest.raises(ValueError, match="needs at least 2 positions"):
        lm_cross_entropy_loss(logits, tokens, mask)
    per_token = lm_cross_entropy_loss(logits, tokens, mask, per_token=True)
    assert per_token.shape == (2, 0)


def test_a_model_loss_of_one_position_is_refused():
    model = tiny_model(n_layers=1, d_model=8, n_heads=2, n_ctx=8, d_vocab=10, d_mlp=8)
    with pytest.raises(ValueError, match="needs at least 2 positions"):
        model(torch.tensor([[3]]), return_type="loss")
