"""Nested caching (issue 25, item 7): a cache holds its own forward's activations only.

A hook inside `run_with_cache` that runs the model again (a nested `run_with_cache`, or a
plain forward on another prompt) left the outer cache holding the inner prompt's
activations at every point before the hook: two prompts' shapes in one cache.
"""

import torch

from hookedattn.testing import random_tiny_model

POINT = "blocks.1.hook_resid_pre"


def model_and_prompts():
    model = random_tiny_model(dtype=torch.float64)
    outer = torch.randint(0, model.cfg.d_vocab, (2, 7), generator=torch.Generator().manual_seed(0))
    inner = torch.randint(0, model.cfg.d_vocab, (1, 3), generator=torch.Generator().manual_seed(1))
    return model, outer, inner


def assert_same_cache(got, expected):
    assert sorted(got.keys()) == sorted(expected.keys())
    for name in expected:
        assert torch.equal(got[name], expected[name]), name


def test_a_nested_run_with_cache_keeps_both_caches_apart():
    """Guards: the outer cache held the inner prompt's activations before the hook."""
    model, outer, inner = model_and_prompts()
    inner_caches = []

    def look_elsewhere(resid, hook):
        if not inner_caches:  # the inner forward passes this hook too: run it once
            inner_caches.append(None)
            inner_caches[0] = model.run_with_cache(inner)[1]

    with model.hooks([(POINT, look_elsewhere)]):
        logits, cache = model.run_with_cache(outer)
    clean_logits, clean_outer = model.run_with_cache(outer)
    _, clean_inner = model.run_with_cache(inner)
    assert torch.equal(logits, clean_logits)
    assert_same_cache(cache, clean_outer)
    assert_same_cache(inner_caches[0], clean_inner)


def test_a_plain_forward_inside_a_hook_leaves_the_cache_alone():
    """Guards: `model(other)` from a hook also wrote the other prompt into the cache."""
    model, outer, inner = model_and_prompts()

    ran = []

    def run_again(resid, hook):
        if not ran:
            ran.append(True)
            model(inner)

    with model.hooks([(POINT, run_again)]):
        _, cache = model.run_with_cache(outer, names_filter=lambda name: "resid" in name)
    _, clean = model.run_with_cache(outer, names_filter=lambda name: "resid" in name)
    assert_same_cache(cache, clean)
