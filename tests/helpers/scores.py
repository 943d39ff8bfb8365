"""Attention scores checked one query-key pair at a time, against vectors built by hand."""

from collections.abc import Callable
from typing import Any

import torch

# (batch index, head, position) -> the query or key vector as the test computes it.
Vector = Callable[[int, int, int], torch.Tensor]


def assert_causal_scores(
    cache: Any, layer: int, query: Vector, key: Vector, scale: float, atol: float = 1e-12
) -> None:
    """Every causal score of block `layer` (`hook_attn_scores`, before the mask) equals
    `query(b, h, i) . key(b, h, j) / scale` within `atol`, pair by pair."""
    scores = cache[f"blocks.{layer}.attn.hook_attn_scores"]
    batch, n_heads, n_pos, _ = scores.shape
    for b in range(batch):
        for h in range(n_heads):
            qs = [query(b, h, i) for i in range(n_pos)]
            ks = [key(b, h, j) for j in range(n_pos)]
            for i in range(n_pos):
                for j in range(i + 1):
                    expected = qs[i] @ ks[j] / scale
                    assert abs(float(scores[b, h, i, j] - expected)) < atol, (b, h, i, j)
