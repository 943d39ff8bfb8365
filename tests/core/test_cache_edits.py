"""The cache's promise: what it holds never changes, and no edit of it goes unnoticed."""

import copy
import pickle

import pytest
import torch

from hookedattn import ActivationCache, HookedTransformer
from hookedattn.core.cache import CacheEditedError
from hookedattn.testing import tiny_model

TOKENS = torch.tensor([[1, 2, 3, 4, 5], [5, 4, 3, 2, 1]])


@pytest.fixture(scope="module")
def model() -> HookedTransformer:
    return tiny_model(n_ctx=8, d_mlp=32, dtype=torch.float32)


def test_an_edit_through_one_entry_is_caught_at_every_entry_sharing_its_storage(model):
    _, cache = model.run_with_cache(TOKENS)
    cache["resid_post", 0][0] = 0
    for key, name in [(("resid_pre", 1), "blocks.1.hook_resid_pre"), (("resid_post", 0), "")]:
        with pytest.raises(CacheEditedError, match=f"cache entry '{name or 'blocks.0'}"):
            cache[key]
    cache["pattern", 0]  # an entry with storage of its own is still readable


def test_an_in_place_method_on_a_cached_pattern_is_caught(model):
    _, cache = model.run_with_cache(TOKENS)
    cache["pattern", 1].mul_(0)
    with pytest.raises(CacheEditedError, match="blocks.1.attn.hook_pattern"):
        cache["pattern", 1]
    with pytest.raises(CacheEditedError):
        list(cache.values())
    with pytest.raises(CacheEditedError):
        cache.stack("pattern")


def test_augmented_assignment_is_refused_and_never_silent(model):
    _, cache = model.run_with_cache(TOKENS)
    with pytest.raises(TypeError, match="edited in place before this assignment"):
        cache["pattern", 0] += 1
    with pytest.raises(CacheEditedError):
        cache["pattern", 0]


def test_the_residual_stream_passed_in_is_not_the_cached_one(model):
    resid = torch.randn(2, 5, 16)
    _, cache = model.run_with_cache(resid, start_at_layer=1)
    recorded = cache["resid_pre", 1].clone()
    resid.zero_()  # the caller's own tensor: theirs to edit
    torch.testing.assert_close(cache["resid_pre", 1], recorded)


def test_the_residual_stream_returned_is_not_the_cached_one(model):
    out, cache = model.run_with_cache(TOKENS, stop_at_layer=1)
    recorded = cache["resid_post", 0].clone()
    out.zero_()
    torch.testing.assert_close(cache["resid_post", 0], recorded)


def test_the_logits_returned_are_the_cached_ones_and_an_edit_of_them_is_caught(model):
    logits, cache = model.run_with_cache(TOKENS)
    cached = cache["unembed.hook_out"]
    assert cached.untyped_storage().data_ptr() == logits.untyped_storage().data_ptr()  # once
    logits[0, 0, 0] = 1e6  # the caller's edit reaches the cached tensor: reading says so
    with pytest.raises(CacheEditedError, match="unembed.hook_out"):
        cache["unembed.hook_out"]
    cache["resid_post", 1]  # the rest of the cache is untouched


def test_caches_of_other_kinds_notice_edits_too(model):
    _, cache = model.run_with_cache(TOKENS, incl_bwd=True, return_type="loss")
    assert all(t is not None for t in cache.values())  # the backward edits nothing
    cache["blocks.0.hook_resid_post_grad"].zero_()
    with pytest.raises(CacheEditedError, match="blocks.1.hook_resid_pre_grad"):
        cache["blocks.1.hook_resid_pre_grad"]
    source = {"blocks.0.attn.hook_pattern": torch.rand(1, 4, 5, 5)}
    built = ActivationCache(source, n_layers=1)
    source["blocks.0.attn.hook_pattern"].add_(1)
    with pytest.raises(CacheEditedError):
        built["pattern", 0]
    with pytest.raises(CacheEditedError):
        built.to("cpu")


def test_the_sharing_stays_cheap(model):
    # No copy where nothing can write: the stream leaving block 0 is the one entering 1.
    _, cache = model.run_with_cache(TOKENS)
    assert cache["resid_post", 0].data_ptr() == cache["resid_pre", 1].data_ptr()
    assert cache["pattern", 0] is cache["blocks.0.attn.hook_pattern"]


@pytest.mark.parametrize("pos_slice", [5, -6, 9, slice(5, None), slice(7, 9), [0, 5], [-6]])
def test_a_pos_slice_out_of_range_is_refused(model, pos_slice):
    with pytest.raises(ValueError, match=r"pos_slice=.* 5 positions \(valid indices -5..4\)"):
        model.run_with_cache(TOKENS, pos_slice=pos_slice)
    assert model.attached_hooks() == []


@pytest.mark.parametrize("pos_slice", [4, -5, -1, slice(1, 3), [0, -1]])
def test_a_pos_slice_in_range_keeps_those_positions(model, pos_slice):
    _, full = model.run_with_cache(TOKENS)
    _, sliced = model.run_with_cache(TOKENS, pos_slice=pos_slice)
    index = slice(pos_slice, pos_slice + 1 or None) if isinstance(pos_slice, int) else pos_slice
    torch.testing.assert_close(sliced["resid_post", 1], full["resid_post", 1][:, index])


def test_a_copied_or_pickled_cache_keeps_what_was_edited_and_nothing_else(model):
    _, cache = model.run_with_cache(TOKENS)
    cache["pattern", 0].mul_(0)
    for again in (copy.deepcopy(cache), pickle.loads(pickle.dumps(cache))):
        with pytest.raises(CacheEditedError):
            again["pattern", 0]
        torch.testing.assert_close(again["pattern", 1], cache["pattern", 1])
