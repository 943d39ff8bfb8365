"""Attention patterns of a frozen forward, kept as what they are made from.

A layer's pattern `[head pos key_pos]` grows as the square of the prompt. What it is made
from does not: the queries and keys as the scores read them (after q/k norms and rotation,
`Attention.scored`), `[pos head d_head]` and `[pos kv_head d_head]`. A frozen forward keeps
those, and a block of the pattern's rows is made again when a transposed map reads it, by
the attention component's own equation (`Attention.pattern`: scale, soft cap, causal and
windowed masks, sinks), over the keys up to the block's last query (later keys are blocked
for every query in it). A block holds as many rows as fit in `pattern_bytes`, counting the
copies the scores go through on the way to the pattern (`COPIES`).
"""

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Bool, Float
from torch import Tensor, nn

from hookedattn.core import kernels

# The pattern-sized tensors a block's rows pass through at once: the scores, the masked
# scores, the pattern, and the product that reads it.
COPIES = 4

# The bytes a block of pattern rows may take unless told (`pattern_bytes`).
PATTERN_BYTES = 16 * 2**20


@dataclasses.dataclass(frozen=True)
class FrozenScores:
    """One attention layer's queries and keys as its scores read them, and its component:
    the pattern, a block of rows at a time (module docstring)."""

    attention: nn.Module
    queries: Float[Tensor, "pos head d_head"]
    keys: Float[Tensor, "pos kv_head d_head"]
    window_size: int | None
    pattern_bytes: int

    def prefix(self, m: int) -> "FrozenScores":
        """The same on the prompt's first `m` positions."""
        return dataclasses.replace(self, queries=self.queries[:m], keys=self.keys[:m])

    def block_rows(self) -> int:
        """How many pattern rows a block holds within `pattern_bytes`."""
        n_pos, n_heads, _ = self.queries.shape
        row = COPIES * n_heads * n_pos * self.queries.element_size()
        return max(1, min(n_pos, self.pattern_bytes // row))

    def blocks(self, live: Bool[Tensor, " pos"]) -> Iterator[tuple[int, int]]:
        """`(start, stop)` of each block of query positions holding a `live` one, the last
        first: a target's gradient is zero after its own position, so the blocks past every
        target's (and, in the layer a target reads, before it) carry nothing. A block reads
        the keys up to its last query, so the last block's tensors are the largest: each
        later one fits where an earlier one was freed, and the heap does not grow block by
        block."""
        size = self.block_rows()
        n_pos = len(self.queries)
        padded = live.new_zeros(-(-n_pos // size) * size)
        padded[:n_pos] = live
        occupied = padded.reshape(-1, size).any(-1)
        for block in occupied.nonzero().flatten().flip(0).tolist():
            yield block * size, min(n_pos, (block + 1) * size)

    def rows(self, start: int, stop: int) -> Float[Tensor, "head query_pos key_pos"]:
        """Rows `start..stop-1` of the pattern over keys `0..stop-1` (later keys are blocked
        for all of them), by the component's own equation."""
        device = self.queries.device
        real = torch.ones(1, stop, dtype=torch.long, device=device)  # no padding
        context = kernels.rows_context(
            real, torch.arange(start, stop, device=device), self.window_size
        )
        q, k = self.queries[None, start:stop], self.keys[None, :stop]
        return self.attention.pattern(q, k, context)[0]

    def row_sums(self) -> Float[Tensor, "head pos"]:
        """Each pattern row's sum (one, to rounding; less with sinks), block by block."""
        every = torch.ones(len(self.queries), dtype=torch.bool, device=self.queries.device)
        sums = [self.rows(start, stop).sum(-1) for start, stop in self.blocks(every)]
        return torch.cat(sums[::-1], dim=-1)


def frozen_scores(
    model: Any, cache: Any, n_pos: int, pattern_bytes: int
) -> tuple[FrozenScores, ...]:
    """Every layer's `FrozenScores`, from the values a forward cached at `attn.hook_q` and
    `attn.hook_k` (batch of one). A ValueError where blocks read earlier blocks' keys
    (`n_kv_shared_layers`): they have no `hook_k` of their own."""
    if model.cfg.n_kv_shared_layers:
        raise ValueError(
            f"frozen attention patterns rebuild each block's scores from its own hook_q and "
            f"hook_k; this model's last {model.cfg.n_kv_shared_layers} blocks read earlier "
            f"blocks' keys (n_kv_shared_layers), which this does not follow"
        )
    device = cache["blocks.0.attn.hook_q"].device
    positions = torch.arange(n_pos, device=device)[None]
    context = kernels.AttentionContext({}, positions)  # the rotation reads positions only
    layers = []
    for layer, block in enumerate(model.blocks):
        q, k = (cache[f"blocks.{layer}.attn.hook_{x}"] for x in "qk")
        q, k = block.attn.scored(q, k, context)
        layers.append(FrozenScores(block.attn, q[0], k[0], model.cfg.window_size, pattern_bytes))
    return tuple(layers)
