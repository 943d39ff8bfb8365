"""Config validation: every inconsistency is a ValueError that names the field, and every
field is checked against its spec, the error naming its value and range."""

import math

import pytest
import torch

from hookedattn import HookedTransformerConfig

BASE = dict(n_layers=1, d_model=16, n_ctx=8, d_vocab=10, n_heads=2, d_mlp=32)


def config(**overrides) -> HookedTransformerConfig:
    return HookedTransformerConfig(**{**BASE, **overrides})


def test_d_head_defaults_to_d_model_over_n_heads():
    assert config().d_head == 8


def test_n_heads_defaults_to_d_model_over_d_head():
    assert config(n_heads=None, d_head=4).n_heads == 4


def test_d_model_must_divide_when_heads_are_derived():
    with pytest.raises(ValueError, match="d_model=16, n_heads=3"):
        config(n_heads=3)
    with pytest.raises(ValueError, match="d_model=16, d_head=5"):
        config(n_heads=None, d_head=5)


def test_explicit_heads_need_not_tile_d_model():
    cfg = config(n_heads=3, d_head=5)
    assert (cfg.n_heads, cfg.d_head) == (3, 5)


def test_neither_n_heads_nor_d_head_is_an_error():
    with pytest.raises(ValueError, match="n_heads or d_head"):
        config(n_heads=None)


def test_d_mlp_is_required_for_a_model_with_mlps():
    with pytest.raises(ValueError, match="d_mlp is required"):
        config(d_mlp=None)
    assert config(d_mlp=None, attn_only=True).d_mlp is None


@pytest.mark.parametrize(
    ("field", "value", "hint"),
    [
        ("act_fn", "gleu", "'gelu'"),
        ("normalization_type", "ln", "'LN'"),
        ("positional_embedding_type", "rotory", "'rotary'"),
        ("dtype", "float63", "'float64'"),
    ],
)
def test_unknown_choices_name_the_closest_valid_ones(field, value, hint):
    with pytest.raises(ValueError, match=hint):
        config(**{field: value})


@pytest.mark.parametrize("field", ["n_layers", "d_model", "n_ctx", "d_vocab"])
def test_sizes_must_be_positive_ints(field):
    with pytest.raises(ValueError, match=field):
        config(**{field: -1})


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("eps", -1.0, ValueError),
        ("eps", math.nan, ValueError),
        ("attn_scale", 0.0, ValueError),
        ("attn_scale", math.nan, ValueError),
        ("use_attn_result", "false", TypeError),
        ("d_vocab_out", -1, ValueError),
        ("d_mlp", True, TypeError),
        ("init_range", "x", TypeError),
        ("seed", "abc", TypeError),
        ("n_layers", 10**7, ValueError),
        ("rotary_base", math.inf, ValueError),
    ],
)
def test_every_config_field_is_checked_with_its_name_value_and_range(field, value, error):
    with pytest.raises(error, match=field) as info:
        HookedTransformerConfig(**{**BASE, field: value})
    assert repr(value) in str(info.value)


def test_zero_layers_is_allowed():
    assert config(n_layers=0).n_layers == 0


def test_odd_rotary_dim_is_an_error():
    with pytest.raises(ValueError, match="rotary_dim"):
        config(positional_embedding_type="rotary", rotary_dim=3)


def test_attn_in_and_split_qkv_are_exclusive():
    with pytest.raises(ValueError, match="use_attn_in"):
        config(use_attn_in=True, use_split_qkv_input=True)


def test_hook_mlp_in_needs_an_mlp():
    with pytest.raises(ValueError, match="use_hook_mlp_in"):
        config(attn_only=True, use_hook_mlp_in=True)


def test_dtype_accepts_names():
    assert config(dtype="float64").dtype == torch.float64


def test_round_trip_through_dict():
    cfg = config(dtype=torch.bfloat16, positional_embedding_type="rotary", seed=3)
    assert HookedTransformerConfig.from_dict(cfg.to_dict()) == cfg


def test_from_dict_names_unknown_fields():
    with pytest.raises(ValueError, match="n_layer"):
        HookedTransformerConfig.from_dict({**BASE, "n_layer": 2})


def test_config_is_frozen():
    with pytest.raises(AttributeError):
        config().d_model = 8
