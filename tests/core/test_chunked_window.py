"""Chunked local attention (`window_chunked`, Llama 4's `attention_chunk_size`): a query in a
local layer reads the keys of its own chunk of `window_size` stored positions, up to itself.
The masks are checked against a loop over every query and key; a model's patterns, its fused
and written-out runs, and a generation step past a chunk boundary against the full forward."""

import pytest
import torch

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core import kernels
from hookedattn.core.kernels._masks import next_token_context
from hookedattn.core.kv_cache import KeyValueCache
from hookedattn.testing.models import randomize_parameters

CHUNK = 3


def _looped(queries: range, n_keys: int) -> torch.Tensor:
    """True where query q may not read key k: later, or in another chunk."""
    return torch.tensor(
        [[k > q or k // CHUNK != q // CHUNK for k in range(n_keys)] for q in queries]
    )


def test_fresh_sequence_mask_is_the_chunks() -> None:
    context = kernels.attention_context(64, 2, 10, None, None, CHUNK, "cpu", chunked=True)
    blocked = context.blocked["local"]
    assert torch.equal(blocked[0, 0], _looped(range(10), 10))
    later = torch.arange(10)[None, :] > torch.arange(10)[:, None]
    assert torch.equal(context.blocked["global"][0, 0], later)


def test_rows_of_a_stored_sequence_are_the_chunks() -> None:
    queries = torch.tensor([2, 3, 7, 8])
    full = torch.ones(1, 9, dtype=torch.long)
    context = kernels.rows_context(full, queries, CHUNK, chunked=True)
    want = _looped(range(9), 9)[queries]
    assert torch.equal(context.blocked["local"][0, 0], want)


def test_sliding_window_is_unchanged_without_chunks() -> None:
    context = kernels.attention_context(64, 1, 8, None, None, CHUNK, "cpu")
    q, k = torch.arange(8)[:, None], torch.arange(8)[None, :]
    assert torch.equal(context.blocked["local"][0, 0], (k > q) | (q - k >= CHUNK))


def _model(**overrides) -> HookedTransformer:
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=16, n_heads=4, d_head=4, n_ctx=32, d_vocab=19, d_mlp=8,
        act_fn="silu", normalization_type="RMS", positional_embedding_type="rotary",
        window_size=CHUNK, window_chunked=True, attn_types=("local", "global"),
        dtype="float64", seed=0, **overrides,
    )  # fmt: skip
    return randomize_parameters(HookedTransformer(cfg), scale=0.5, seed=1)


TOKENS = torch.randint(0, 19, (2, 8), generator=torch.Generator().manual_seed(2))


def test_local_pattern_is_zero_outside_the_chunk_and_global_is_not() -> None:
    _, cache = _model().run_with_cache(TOKENS)
    outside = _looped(range(8), 8) & ~(torch.arange(8)[None, :] > torch.arange(8)[:, None])
    assert bool((cache["blocks.0.attn.hook_pattern"][..., outside] == 0).all())
    assert bool((cache["blocks.1.attn.hook_pattern"][..., outside] > 0).all())
    sums = cache["blocks.0.attn.hook_pattern"].sum(-1)
    torch.testing.assert_close(sums, torch.ones_like(sums), rtol=0, atol=1e-12)


def test_fused_and_written_out_runs_agree() -> None:
    fused = _model()(TOKENS)
    written = _model(use_fused_kernels=False)(TOKENS)
    torch.testing.assert_close(fused, written, rtol=0, atol=1e-12)


def test_cached_steps_past_a_chunk_boundary_equal_the_full_forward() -> None:
    model = _model()
    full = model(TOKENS)
    cache = KeyValueCache.empty(model.cfg, batch=TOKENS.shape[0])
    logits = [model(TOKENS[:, :2], past_kv_cache=cache)]
    for p in range(2, 8):  # positions 3 and 6 open new chunks
        logits.append(model(TOKENS[:, p : p + 1], past_kv_cache=cache))
    torch.testing.assert_close(torch.cat(logits, dim=1), full, rtol=0, atol=1e-12)


def test_one_generation_step_mask_is_its_chunk() -> None:
    model = _model()
    cache = KeyValueCache.empty(model.cfg, batch=1)
    model(TOKENS[:1, :7], past_kv_cache=cache)
    context = next_token_context(cache, CHUNK, chunked=True)
    assert torch.equal(context.blocked["local"][0, 0], _looped(range(7, 8), 8))


def test_chunks_need_a_window() -> None:
    with pytest.raises(ValueError, match="window_chunked cuts the window into chunks"):
        HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=4, d_head=4, d_vocab=5,
                                attn_only=True, window_chunked=True)  # fmt: skip
