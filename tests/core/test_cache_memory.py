"""What a cache keeps alive: each activation once, and nothing that was not asked for.

The reference for "each activation once" is the forward itself: a run whose hooks keep a
plain reference to every activation shows which hook points see the same tensor (the
residual stream leaving block `l` is the one entering block `l + 1`). A full cache must
share storage exactly where the forward does, and hold no more bytes than those tensors.

"Nothing else alive" is checked with weak references to the activations' storages, taken
by a bookkeeping hook (marked like the cache's own, so the cache still takes its no-copy
path): after the call, every storage still alive is one the cache holds.
"""

import gc
import weakref
from functools import partial

import pytest
import torch

from hookedattn import HookedTransformer
from hookedattn.testing import tiny_model

CONFIGS = {
    "default": {},
    "attn_only": {"attn_only": True, "d_mlp": None},
    "every_optional_hook": {
        "use_attn_result": True,
        "use_split_qkv_input": True,
        "use_hook_mlp_in": True,
        "positional_embedding_type": "rotary",
    },
    "attn_in_rms": {"use_attn_in": True, "normalization_type": "RMS"},
}
TOKENS = torch.tensor([[3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8]])


make_model = partial(tiny_model, n_ctx=8, d_vocab=10, d_mlp=32, dtype=torch.float32)


def _storage_groups(tensors: dict[str, torch.Tensor]) -> set[frozenset[str]]:
    """Names grouped by the storage their tensor lives in."""
    groups: dict[int, set[str]] = {}
    for name, t in tensors.items():
        groups.setdefault(t.untyped_storage().data_ptr(), set()).add(name)
    return {frozenset(g) for g in groups.values()}


def _forward_activations(model: HookedTransformer) -> dict[str, torch.Tensor]:
    """Every activation of one hook-free forward, kept alive by plain references."""
    seen: dict[str, torch.Tensor] = {}

    def keep(x: torch.Tensor, hook) -> None:
        seen[hook.name] = x

    model.run_with_hooks(TOKENS, fwd_hooks=[(lambda name: True, keep)])
    return seen


@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_a_full_cache_shares_storage_exactly_where_the_forward_does(overrides):
    model = make_model(**overrides)
    forward = _forward_activations(model)
    _, cache = model.run_with_cache(TOKENS)
    assert _storage_groups(dict(cache.items())) == _storage_groups(forward)


@pytest.mark.parametrize("overrides", CONFIGS.values(), ids=CONFIGS.keys())
def test_a_full_cache_holds_the_bytes_of_the_distinct_activations_and_no_more(overrides):
    model = make_model(**overrides)
    forward = _forward_activations(model)
    distinct = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in forward.values()
    }
    _, cache = model.run_with_cache(TOKENS)
    assert cache.nbytes() == sum(distinct.values())
    # And no cached tensor keeps a larger buffer alive: each storage holds no more than the
    # activations that view it (q, k and v are slices of one fused product, one storage).
    viewed: dict[int, dict[int, int]] = {}
    for t in cache.values():
        viewed.setdefault(t.untyped_storage().data_ptr(), {})[t.storage_offset()] = (
            t.numel() * t.element_size()
        )
    for name, t in cache.items():
        storage = t.untyped_storage()
        assert storage.nbytes() <= sum(viewed[storage.data_ptr()].values()), name


def _watch_storages(model: HookedTransformer) -> dict[str, weakref.ref]:
    """Weak references to every activation's storage during the next forward."""
    refs: dict[str, weakref.ref] = {}

    def watch(x: torch.Tensor, hook) -> None:
        refs[hook.name] = weakref.ref(x.untyped_storage())

    for point in model.hook_dict.values():
        point.add_hook(watch, _is_cache=True)
    return refs


def _alive_after(model: HookedTransformer, **cache_kwargs) -> tuple[set[str], set[int]]:
    refs = _watch_storages(model)
    try:
        logits, cache = model.run_with_cache(TOKENS, **cache_kwargs)
    finally:
        model.reset_hooks()
    del logits
    gc.collect()
    alive = {name for name, ref in refs.items() if ref() is not None}
    cached = {t.untyped_storage().data_ptr() for t in cache.values()}
    alive_ptrs = {refs[name]().data_ptr() for name in alive}
    assert alive_ptrs <= cached  # whatever survives, the cache is what holds it
    return alive, cached


@pytest.mark.parametrize(
    "names_filter",
    [
        "blocks.1.attn.hook_pattern",
        ["blocks.0.hook_resid_post", "blocks.1.mlp.hook_post"],
        lambda name: name.endswith("hook_scale"),
    ],
    ids=["one_name", "list", "predicate"],
)
def test_names_filter_keeps_no_unrequested_activation_alive(names_filter):
    model = make_model()
    alive, _ = _alive_after(model, names_filter=names_filter)
    requested = set(model.run_with_cache(TOKENS, names_filter=names_filter)[1].keys())
    forward = _forward_activations(model)
    # An unrequested name may survive only as the very tensor of a requested one.
    aliases = {name for group in _storage_groups(forward) if group & requested for name in group}
    assert requested <= alive
    assert alive <= aliases


def test_a_cache_in_another_dtype_keeps_no_activation_of_the_forward_alive():
    model = make_model()
    alive, _ = _alive_after(model, names_filter=["blocks.0.attn.hook_z"], dtype=torch.float64)
    assert alive == set()


def test_a_position_slice_keeps_only_the_positions_asked_for():
    model = make_model()
    _, cache = model.run_with_cache(TOKENS, pos_slice=-1)
    for name, t in cache.items():
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size(), name
    alive, _ = _alive_after(model, names_filter=["blocks.1.hook_resid_post"], pos_slice=-1)
    assert alive == set()


def test_an_in_place_edit_of_one_heads_input_reaches_neither_the_stream_nor_other_heads():
    model = make_model(use_split_qkv_input=True)

    def zero_head_1(x: torch.Tensor, hook) -> None:
        x[:, :, 1] = 0

    _, clean = model.run_with_cache(TOKENS)
    with model.hooks(fwd_hooks=[("blocks.0.hook_q_input", zero_head_1)]):
        _, edited = model.run_with_cache(TOKENS)
    assert torch.equal(edited["blocks.0.hook_resid_pre"], clean["blocks.0.hook_resid_pre"])
    assert torch.equal(edited["blocks.0.hook_k_input"], clean["blocks.0.hook_k_input"])
    assert torch.equal(edited["q_input", 0][:, :, 0], clean["q_input", 0][:, :, 0])
    assert not edited["q_input", 0][:, :, 1].any()
