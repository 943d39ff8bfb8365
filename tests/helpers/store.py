"""The tiny byte-level model the store's tests collect from, and the point they store; also
imported by a worker process that test_store_bad_input.py runs on a full disk."""

from hookedattn import ByteTokenizer, HookedTransformer
from hookedattn.testing import random_tiny_model

RESID = "blocks.1.hook_resid_pre"


def byte_model(scale: float = 0.5) -> HookedTransformer:
    """A random attention-only model over bytes (seeded): the same model on every call."""
    fields = dict(n_heads=2, d_head=8, n_ctx=8, d_vocab=259, attn_only=True)
    return random_tiny_model(scale=scale, tokenizer=ByteTokenizer(), **fields)
