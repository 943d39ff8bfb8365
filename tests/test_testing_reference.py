"""The shipped reference forward (`hookedattn.testing.reference`) against the model.

The reference and the model share no code, so agreement to float64 rounding on every
option the reference covers is evidence for both; a config it does not write out is
refused by name rather than answered wrongly.
"""

import pytest
import torch

from hookedattn.testing import random_tiny_model, random_tokens
from hookedattn.testing.reference import ReferenceTransformer, reference_forward

VARIANTS = {
    "default": {},
    "attn_only": {"attn_only": True},
    "rms_silu": {"normalization_type": "RMS", "act_fn": "silu"},
    "lnpre_gelu": {"normalization_type": "LNPre", "act_fn": "gelu"},
    "no_norm_gelu_new": {"normalization_type": None, "act_fn": "gelu_new"},
    "partial_rotary": {"positional_embedding_type": "rotary", "rotary_dim": 2},
    "no_positions": {"positional_embedding_type": "none"},
    "odd_shapes": {"d_head": 5, "n_heads": 3, "d_vocab_out": 11},
    "no_layers": {"n_layers": 0},
}


@pytest.mark.parametrize("overrides", VARIANTS.values(), ids=VARIANTS.keys())
def test_reference_matches_the_model_in_float64(overrides):
    model = random_tiny_model(n_ctx=12, **overrides)
    tokens = random_tokens(model.cfg.d_vocab, batch=2, pos=9, seed=2)
    torch.testing.assert_close(
        reference_forward(model, tokens), model(tokens), rtol=1e-10, atol=1e-10
    )


def test_reference_matches_the_model_in_float32_at_full_length():
    model = random_tiny_model(dtype=torch.float32, positional_embedding_type="rotary")
    tokens = random_tokens(model.cfg.d_vocab, batch=2, pos=model.cfg.n_ctx, seed=3)
    torch.testing.assert_close(reference_forward(model, tokens), model(tokens))


def test_reference_keeps_the_weights_it_was_built_from():
    model = random_tiny_model()
    tokens = random_tokens(model.cfg.d_vocab, batch=1, pos=5)
    reference = ReferenceTransformer(model)
    with torch.no_grad():
        model.blocks[1].attn.W_O[0, 0, 0] += 1.0
    assert not torch.allclose(reference(tokens), model(tokens))
    torch.testing.assert_close(reference_forward(model, tokens), model(tokens))


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"gated_mlp": True}, "gated_mlp=True"),
        ({"n_key_value_heads": 2}, "n_key_value_heads=2"),
        ({"normalization_placement": "post"}, "normalization_placement='post'"),
    ],
)
def test_a_block_the_reference_does_not_write_out_is_refused_by_name(overrides, named):
    with pytest.raises(NotImplementedError, match=named):
        ReferenceTransformer(random_tiny_model(**overrides))
