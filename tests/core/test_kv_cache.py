"""`KeyValueCacheEntry` keeps its positions in growing buffers, against plain concatenation;
and a forward that fails leaves its `KeyValueCache` as it was (all or nothing)."""

import math
from functools import partial

import pytest
import torch

from hookedattn import KeyValueCache, KeyValueCacheEntry
from hookedattn.testing import tiny_model


def random_positions(n: int, seed: int, batch: int = 2) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(batch, n, 3, 4, generator=generator, dtype=torch.float64)


def empty_entry(batch: int = 2) -> KeyValueCacheEntry:
    return KeyValueCacheEntry(torch.empty(batch, 0, 3, 4), torch.empty(batch, 0, 3, 4))


def test_appends_one_at_a_time_equal_one_concatenation():
    entry = empty_entry()
    chunks = [(random_positions(n, seed), random_positions(n, seed + 100)) for seed, n in
              enumerate([5, 1, 1, 3, 1, 7, 1])]  # fmt: skip
    for new_keys, new_values in chunks:
        keys, values = entry.append(new_keys, new_values)
    expected_keys = torch.cat([k for k, _ in chunks], dim=1)
    expected_values = torch.cat([v for _, v in chunks], dim=1)
    assert torch.equal(keys, expected_keys) and torch.equal(values, expected_values)
    assert torch.equal(entry.past_keys, expected_keys)
    assert torch.equal(entry.past_values, expected_values)


def test_tensors_given_to_the_constructor_are_never_written_to():
    # A broadcast view (as patching builds them): writing into it would corrupt every row.
    past = torch.arange(12.0, dtype=torch.float64).reshape(1, 1, 3, 4).expand(2, 1, 3, 4)
    before = past.clone()
    entry = KeyValueCacheEntry(past, past)
    new = random_positions(1, 0)
    keys, _ = entry.append(new, new)
    assert torch.equal(past, before)
    assert torch.equal(keys, torch.cat([before, new], dim=1))


def test_keys_returned_earlier_do_not_change_when_more_are_appended():
    entry = empty_entry()
    first, _ = entry.append(random_positions(2, 1), random_positions(2, 2))
    kept = first.clone()
    for seed in range(20):  # enough appends to outgrow the buffer several times
        entry.append(random_positions(1, 10 + seed), random_positions(1, 40 + seed))
    assert torch.equal(first, kept)


def test_buffers_grow_geometrically():
    entry, n_steps, buffers = empty_entry(), 64, set()
    for seed in range(n_steps):
        keys, _ = entry.append(random_positions(1, seed), random_positions(1, seed))
        buffers.add(keys.untyped_storage().data_ptr())
    assert entry.past_keys.shape[1] == n_steps
    assert len(buffers) <= math.log2(n_steps) + 2


def test_a_frozen_entry_returns_the_concatenation_and_keeps_its_past():
    past_keys, past_values = random_positions(3, 0), random_positions(3, 1)
    entry = KeyValueCacheEntry(past_keys, past_values, frozen=True)
    new_keys, new_values = random_positions(1, 2), random_positions(1, 3)
    keys, values = entry.append(new_keys, new_values)
    assert torch.equal(keys, torch.cat([past_keys, new_keys], dim=1))
    assert torch.equal(values, torch.cat([past_values, new_values], dim=1))
    assert torch.equal(entry.past_keys, past_keys) and torch.equal(entry.past_values, past_values)


def test_repr_is_short():
    entry = KeyValueCacheEntry(random_positions(3, 0), random_positions(3, 1), frozen=True)
    assert repr(entry) == "KeyValueCacheEntry(batch=2, pos=3, head=3, d_head=4, frozen)"


# ------------------------------------------------------------ a failed forward
make_model = partial(
    tiny_model, n_layers=2, d_model=16, n_heads=2, d_head=8, n_ctx=32, d_vocab=23, d_mlp=32
)
TOKENS = torch.randint(0, 23, (2, 9), generator=torch.Generator().manual_seed(0))


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


# ------------------------------------------------ a generation step's real token, noted
def step_once(model, cache, token, fail_at=None):
    hooks = [] if fail_at is None else raise_at(fail_at)
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        return model._next_token_step(token, cache)[0]


def test_a_steps_real_token_joins_the_mask_when_it_is_read():
    model = make_model()
    cache = KeyValueCache.empty(model.cfg, batch=2)
    mask = torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 1]])
    model(TOKENS[:, :5], attention_mask=mask, past_kv_cache=cache)
    for i in (5, 6):
        step_once(model, cache, TOKENS[:, i : i + 1])
    assert cache.length == 7 and cache.batch == 2
    assert torch.equal(cache.previous_attention_mask, torch.cat([mask, torch.ones(2, 2)], 1))
    assert cache.previous_attention_mask.dtype == torch.long


def test_a_failed_step_leaves_no_real_token_noted():
    model = make_model()
    cache = KeyValueCache.empty(model.cfg, batch=2)
    model(TOKENS[:, :5], past_kv_cache=cache)
    step_once(model, cache, TOKENS[:, 5:6])
    with pytest.raises(RuntimeError, match="stop at"):
        step_once(model, cache, TOKENS[:, 6:7], fail_at="blocks.1.attn.hook_z")
    assert cache.length == 6
    assert torch.equal(cache.previous_attention_mask, torch.ones(2, 6, dtype=torch.long))


def test_a_frozen_cache_notes_no_real_token():
    model = make_model()
    cache = KeyValueCache.empty(model.cfg, batch=2)
    model(TOKENS[:, :5], past_kv_cache=cache)
    cache.freeze()
    cache.extend_by_real_token()
    assert cache.length == 5 and cache.previous_attention_mask.shape == (2, 5)


def test_a_mask_assigned_replaces_the_noted_real_tokens():
    model = make_model()
    cache = KeyValueCache.empty(model.cfg, batch=2)
    model(TOKENS[:, :5], past_kv_cache=cache)
    cache.extend_by_real_token()
    cache.previous_attention_mask = torch.ones(2, 3, dtype=torch.long)
    assert cache.length == 3


def test_the_cache_repr_is_short():
    model = make_model()
    cache = KeyValueCache.empty(model.cfg, batch=2)
    model(TOKENS[:, :5], past_kv_cache=cache)
    assert repr(cache) == "KeyValueCache(layers=2, batch=2, length=5, frozen=False)"
