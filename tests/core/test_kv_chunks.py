"""A KV cache filled in chunks of different sizes computes what one forward computes.

A sequence run as chunks (3, then 1, then 4, ...), each reading the keys and values the
chunks before it left in the cache, must give each position the logits the whole sequence
gives it in one forward: the same positions (rotary angles, learned rows), the same causal
mask across chunk boundaries, the same window. Held here against the model's own full
forward and, where the reference covers the block, against the independent reference
forward; on both execution paths; with every weight, bias and gain random.
"""

import pytest
import torch

from hookedattn import KeyValueCache
from hookedattn.testing import random_tiny_model, random_tokens, reference_forward

TOL = dict(rtol=1e-10, atol=1e-10)
PATHS = {"fused": True, "written_out": False}
CHUNKINGS = {"3+1+4+2+1": (3, 1, 4, 2, 1), "1 at a time": (1,) * 11, "5+6": (5, 6)}
VARIANTS = {
    "learned": {},
    "rotary": {"positional_embedding_type": "rotary"},
    "llama_like": {
        "normalization_type": "RMS",
        "positional_embedding_type": "rotary",
        "gated_mlp": True,
        "act_fn": "silu",
        "n_key_value_heads": 2,
    },
    "attn_only_partial_rotary": {
        "attn_only": True,
        "positional_embedding_type": "rotary",
        "d_head": 8,
        "rotary_dim": 4,
    },
}
# A local window of 3 shorter than most chunks: keys leave the window across boundaries.
WINDOWED = {
    "positional_embedding_type": "rotary",
    "n_key_value_heads": 1,
    "window_size": 3,
    "attn_types": ("local", "global"),
}
TOKENS = random_tokens(32, batch=2, pos=11, seed=11)


def chunked(model, tokens, sizes):
    """The logits of `tokens` run through `model` chunk by chunk with one KV cache."""
    cache, start, logits = KeyValueCache.empty(model.cfg, batch=tokens.shape[0]), 0, []
    for size in sizes:
        logits.append(model(tokens[:, start : start + size], past_kv_cache=cache))
        start += size
    assert start == tokens.shape[1] and cache.length == start
    return torch.cat(logits, dim=1), cache


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("chunks", CHUNKINGS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_chunked_logits_equal_the_reference_forward(variant, chunks, path):
    model = random_tiny_model(use_fused_kernels=PATHS[path], **VARIANTS[variant])
    logits, _ = chunked(model, TOKENS, CHUNKINGS[chunks])
    torch.testing.assert_close(logits, reference_forward(model, TOKENS), **TOL)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("chunks", CHUNKINGS)
def test_chunked_logits_of_a_windowed_model_equal_its_full_forward(chunks, path):
    model = random_tiny_model(use_fused_kernels=PATHS[path], **WINDOWED)
    logits, _ = chunked(model, TOKENS, CHUNKINGS[chunks])
    torch.testing.assert_close(logits, model(TOKENS), **TOL)


@pytest.mark.parametrize("variant", ["rotary", "llama_like"])
def test_the_cache_holds_the_full_forwards_rotated_keys_and_values_at_their_positions(variant):
    model = random_tiny_model(**VARIANTS[variant])
    _, cache = chunked(model, TOKENS, CHUNKINGS["3+1+4+2+1"])
    _, full = model.run_with_cache(TOKENS)
    for layer in range(model.cfg.n_layers):
        torch.testing.assert_close(cache[layer].past_keys, full["rot_k", layer], **TOL)
        torch.testing.assert_close(cache[layer].past_values, full["v", layer], **TOL)


def test_a_chunk_after_a_cache_reads_the_learned_positions_that_follow_it():
    model = random_tiny_model()
    cache = KeyValueCache.empty(model.cfg, batch=2)
    model(TOKENS[:, :3], past_kv_cache=cache)
    model(TOKENS[:, 3:4], past_kv_cache=cache)
    _, chunk = model.run_with_cache(TOKENS[:, 4:8], past_kv_cache=cache)
    W_pos = model.pos_embed.W_pos.detach()
    assert torch.equal(chunk["hook_pos_embed"], W_pos[4:8].expand(2, -1, -1))


def test_a_chunk_after_a_cache_rotates_by_the_positions_that_follow_it():
    # A query at position p and a key at position p' score as if unrotated by p - p': the
    # chunk's queries, at 4..7, against the first key, at 0, score as in one full forward.
    model = random_tiny_model(positional_embedding_type="rotary", attn_only=True)
    _, full = model.run_with_cache(TOKENS[:, :8])
    cache = KeyValueCache.empty(model.cfg, batch=2)
    model(TOKENS[:, :4], past_kv_cache=cache)
    _, chunk = model.run_with_cache(TOKENS[:, 4:8], past_kv_cache=cache)
    torch.testing.assert_close(chunk["attn_scores", 1], full["attn_scores", 1][:, :, 4:], **TOL)


@pytest.mark.parametrize("path", PATHS)
def test_a_left_padded_first_chunk_then_more_chunks_equal_the_padded_full_forward(path):
    model = random_tiny_model(use_fused_kernels=PATHS[path], **VARIANTS["llama_like"])
    mask = torch.ones_like(TOKENS)
    mask[0, :3] = 0  # row 0 is a shorter prompt, left-padded by 3
    full = model(TOKENS, attention_mask=mask)
    cache = KeyValueCache.empty(model.cfg, batch=2)
    pieces = [model(TOKENS[:, :5], attention_mask=mask[:, :5], past_kv_cache=cache)]
    pieces += [
        model(TOKENS[:, 5:6], past_kv_cache=cache),
        model(TOKENS[:, 6:], past_kv_cache=cache),
    ]
    real = mask.bool()
    torch.testing.assert_close(torch.cat(pieces, dim=1)[real], full[real], **TOL)
