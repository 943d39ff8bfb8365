"""Nothing silently wrong in the model's own forward: non-finite values stay where they are,
the KV cache is all or nothing, layer bounds and inputs are checked, config fields are
validated by their specs."""

import math
from functools import partial

import pytest
import torch

from hookedattn import HookedTransformerConfig, KeyValueCache
from hookedattn.testing import tiny_model

BASE = dict(n_layers=2, d_model=16, n_heads=2, d_head=8, n_ctx=32, d_vocab=23, d_mlp=32)


make_model = partial(tiny_model, **BASE)


TOKENS = torch.randint(0, 23, (2, 9), generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("site", ["blocks.0.attn.hook_k", "blocks.0.attn.hook_v"])
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_a_non_finite_key_or_value_never_reaches_earlier_positions(site, value):
    model = make_model()

    def poison(x, hook):
        x[:, 5] = value
        return x

    logits = model.run_with_hooks(TOKENS, fwd_hooks=[(site, poison)])
    clean = model(TOKENS)
    torch.testing.assert_close(logits[:, :5], clean[:, :5], rtol=1e-12, atol=1e-12)
    assert not logits[:, 5:].isfinite().all()


def test_a_finite_key_whose_scores_overflow_leaves_earlier_positions_finite():
    model = make_model(dtype=torch.float32)

    def huge(k, hook):
        k[:, 5] = 3e38
        return k

    logits = model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.attn.hook_k", huge)])
    assert logits[:, :5].isfinite().all()


def test_nan_in_a_padding_position_does_not_reach_real_tokens():
    model = make_model()
    mask = torch.ones_like(TOKENS)
    mask[:, :2] = 0  # left padding

    def poison(resid, hook):
        resid[:, :2] = math.nan
        return resid

    padded = model.run_with_hooks(
        TOKENS, attention_mask=mask, fwd_hooks=[("blocks.0.hook_resid_pre", poison)]
    )
    assert padded[:, 2:].isfinite().all()


def raise_at(name):
    def fail(x, hook):
        raise RuntimeError(f"stop at {hook.name}")

    return [(name, fail)]


@pytest.mark.parametrize(
    "site", ["blocks.1.attn.hook_z", "ln_final.hook_normalized", "blocks.0.attn.hook_k"]
)
def test_a_forward_that_raises_leaves_the_kv_cache_as_it_was(site):
    model = make_model()
    cache = KeyValueCache.empty(model.cfg, batch=2)
    model(TOKENS[:, :5], past_kv_cache=cache)
    before = [(e.past_keys.clone(), e.past_values.clone()) for e in cache.entries]
    with pytest.raises(RuntimeError, match="stop at"):
        model.run_with_hooks(TOKENS[:, 5:6], past_kv_cache=cache, fwd_hooks=raise_at(site))
    assert cache.length == 5
    for entry, (keys, values) in zip(cache.entries, before, strict=True):
        assert torch.equal(entry.past_keys, keys) and torch.equal(entry.past_values, values)


def test_a_retry_after_a_failed_step_gives_the_logits_of_one_step():
    model = make_model()
    cache = KeyValueCache.empty(model.cfg, batch=2)
    model(TOKENS[:, :5], past_kv_cache=cache)
    with pytest.raises(RuntimeError):
        model.run_with_hooks(
            TOKENS[:, 5:6], past_kv_cache=cache, fwd_hooks=raise_at("ln_final.hook_normalized")
        )
    retried = model(TOKENS[:, 5:6], past_kv_cache=cache)
    torch.testing.assert_close(retried[:, 0], model(TOKENS[:, :6])[:, 5], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "bounds",
    [
        {"stop_at_layer": 3},
        {"start_at_layer": -1},
        {"start_at_layer": True},
        {"stop_at_layer": 1.0},
    ],
)
def test_layer_bounds_are_ints_in_0_to_n_layers(bounds):
    model = make_model()
    with pytest.raises(ValueError, match=r"0\.\.2"):
        if "start_at_layer" in bounds:
            model(torch.zeros(2, 9, 16, dtype=torch.float64), **bounds)
        else:
            model(TOKENS, **bounds)


def test_tokens_given_with_start_at_layer_must_match_the_stream():
    model = make_model()
    resid = model(TOKENS, stop_at_layer=1)
    with pytest.raises(ValueError, match=r"tokens= has shape \(1, 3\)"):
        model(resid, start_at_layer=1, return_type="loss", tokens=TOKENS[:1, :3])


def test_out_of_vocabulary_tokens_with_start_at_layer_are_refused():
    model = make_model()
    resid = model(TOKENS, stop_at_layer=1)
    with pytest.raises(ValueError, match="out of range"):
        model(resid, start_at_layer=1, return_type="loss", tokens=TOKENS + 100)


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int16, torch.int32])
def test_narrow_integer_token_ids_give_the_int64_result(dtype):
    model = make_model()
    assert torch.equal(model(TOKENS.to(dtype)), model(TOKENS))


def test_meta_token_ids_are_refused():
    with pytest.raises(ValueError, match="meta"):
        make_model()(torch.empty(2, 3, dtype=torch.long, device="meta"))


def test_a_python_list_as_attention_mask_is_named():
    with pytest.raises(TypeError, match="attention_mask must be a tensor"):
        make_model()(TOKENS, attention_mask=[[1] * 9, [1] * 9])


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


def test_a_long_n_ctx_allocates_nothing_until_a_long_input_comes():
    # The causal mask is built per forward for the input's length, never n_ctx x n_ctx.
    model = make_model(n_ctx=10**6, positional_embedding_type="rotary")
    assert sum(b.numel() for b in model.buffers()) < 10_000
    assert model(TOKENS).shape == (2, 9, 23)
