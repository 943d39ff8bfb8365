"""The shipped reference forward (`hookedattn.testing.reference`) against the model.

The reference and the model share no code, so agreement to float64 rounding on every
option the reference covers is evidence for both; a config it does not write out is
refused by name rather than answered wrongly. Both of the model's execution paths are held
to it: the fused kernels (what a plain forward runs) and the written-out equations
(`use_fused_kernels=False`, what a cached or hooked forward runs). Every weight, bias and
gain is random, so that a forgotten or misplaced term changes the answer.

The reference's constants are the published ones, written in these tests from their
sources (not read from our config): a model whose config disagrees is refused.
"""

import pytest
import torch

from hookedattn.testing import (
    Constants,
    published_constants,
    random_tiny_model,
    random_tokens,
)
from hookedattn.testing.reference import ReferenceTransformer, reference_forward

VARIANTS = {
    "default": {},
    "attn_only": {"attn_only": True},
    "rms_silu": {"normalization_type": "RMS", "act_fn": "silu"},
    "lnpre_gelu": {"normalization_type": "LNPre", "act_fn": "gelu"},
    "rmspre_relu": {"normalization_type": "RMSPre"},
    "no_norm_gelu_new": {"normalization_type": None, "act_fn": "gelu_new"},
    # Two of four frequencies rotated: one frequency alone (rotary_dim 2) is 1 whatever
    # the exponent's denominator, so it could not tell rotary_dim from d_head there.
    "partial_rotary": {"positional_embedding_type": "rotary", "d_head": 8, "rotary_dim": 4},
    "no_positions": {"positional_embedding_type": "none"},
    "odd_shapes": {"d_head": 5, "n_heads": 3, "d_vocab_out": 11},
    "no_layers": {"n_layers": 0},
    "llama_like": {
        "normalization_type": "RMS",
        "positional_embedding_type": "rotary",
        "gated_mlp": True,
        "act_fn": "silu",
        "n_key_value_heads": 2,
    },
    "one_kv_head": {"n_key_value_heads": 1, "positional_embedding_type": "rotary"},
    "neox_like": {
        "parallel_attn_mlp": True,
        "positional_embedding_type": "rotary",
        "rotary_dim": 2,
        "act_fn": "gelu",
    },
    "per_head_inputs": {"use_split_qkv_input": True, "use_attn_result": True},
}
PATHS = {"fused": True, "written_out": False}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("overrides", VARIANTS.values(), ids=VARIANTS.keys())
def test_reference_matches_the_model_in_float64(overrides, path):
    model = random_tiny_model(n_ctx=12, use_fused_kernels=PATHS[path], **overrides)
    tokens = random_tokens(model.cfg.d_vocab, batch=2, pos=9, seed=2)
    torch.testing.assert_close(
        reference_forward(model, tokens), model(tokens), rtol=1e-10, atol=1e-10
    )


@pytest.mark.parametrize("path", PATHS)
def test_reference_matches_the_model_in_float32_at_full_length(path):
    model = random_tiny_model(
        dtype=torch.float32, positional_embedding_type="rotary", use_fused_kernels=PATHS[path]
    )
    tokens = random_tokens(model.cfg.d_vocab, batch=2, pos=model.cfg.n_ctx, seed=3)
    torch.testing.assert_close(reference_forward(model, tokens), model(tokens))


def test_a_cached_run_matches_the_reference_too():
    # Caching hooks every point, so every layer runs written out whatever the config says.
    model = random_tiny_model(n_key_value_heads=2, positional_embedding_type="rotary")
    tokens = random_tokens(model.cfg.d_vocab, batch=2, pos=9, seed=4)
    logits, _ = model.run_with_cache(tokens)
    torch.testing.assert_close(reference_forward(model, tokens), logits, rtol=1e-10, atol=1e-10)


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
        ({"normalization_placement": "post"}, "normalization_placement='post'"),
        ({"use_qk_norm": True, "normalization_type": "RMS"}, "use_qk_norm=True"),
        ({"window_size": 3}, "window_size=3"),
        ({"attn_scores_soft_cap": 2.0}, "attn_scores_soft_cap=2.0"),
    ],
)
def test_a_block_the_reference_does_not_write_out_is_refused_by_name(overrides, named):
    with pytest.raises(NotImplementedError, match=named):
        ReferenceTransformer(random_tiny_model(**overrides))


# ------------------------------------------------------------------ its constants
def test_the_reference_uses_the_published_constants():
    # d_head 4: scores / sqrt(4) = 2 (Vaswani et al. 2017, eq. 1); eps 1e-5
    # (TransformerLens 3.5.1's default); base 10000 (RoFormer, eq. 15).
    reference = ReferenceTransformer(random_tiny_model(positional_embedding_type="rotary"))
    assert reference.constants == Constants(attn_scale=2.0, eps=1e-5, rotary_base=10000.0)


@pytest.mark.parametrize(
    ("field", "value"), [("eps", 1e-6), ("attn_scale", 3.0), ("rotary_base", 500000.0)]
)
def test_a_config_that_disagrees_with_the_published_constants_is_refused(field, value):
    model = random_tiny_model(positional_embedding_type="rotary", **{field: value})
    with pytest.raises(ValueError, match=rf"{field}: the model's config has {value:g}"):
        ReferenceTransformer(model)


@pytest.mark.parametrize(
    ("field", "value"), [("eps", 1e-2), ("attn_scale", 3.0), ("rotary_base", 100.0)]
)
def test_a_stated_constant_is_the_one_the_reference_computes_with(field, value):
    model = random_tiny_model(positional_embedding_type="rotary", **{field: value})
    tokens = random_tokens(model.cfg.d_vocab, batch=2, pos=9, seed=5)
    stated = published_constants(model.cfg.d_head, **{field: value})
    torch.testing.assert_close(
        reference_forward(model, tokens, stated), model(tokens), rtol=1e-10, atol=1e-10
    )


def test_each_constant_moves_the_logits_by_far_more_than_the_float64_tolerance():
    # Else the comparisons above could not tell a constant from its neighbour. The same
    # weights (same seeds, same shapes), one constant changed in the config and stated.
    rotary = {"positional_embedding_type": "rotary"}
    base = random_tiny_model(**rotary)
    tokens = random_tokens(base.cfg.d_vocab, batch=2, pos=9, seed=6)
    for field, value in (("eps", 1e-6), ("attn_scale", 2.02), ("rotary_base", 9000.0)):
        moved = random_tiny_model(**rotary, **{field: value})
        stated = published_constants(base.cfg.d_head, **{field: value})
        change = reference_forward(moved, tokens, stated) - reference_forward(base, tokens)
        assert change.abs().max() > 1e-7, field
