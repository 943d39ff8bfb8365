"""The decay between two positions of a state-space or linear-attention mixer, as a matrix.

A recurrence `S_t = exp(a_t) S_{t-1} + ...` carries what position `s` wrote to position
`t >= s` multiplied by `exp(sum_{r=s+1..t} a_r)`. Mamba-2's SSD mixing (`mamba2`, with
`a_r = dt_r A`) and the gated delta net's (`gated_delta`, with `a_r = g_r`) both need that
sum for every pair `(t, s)`, one matrix per head; this is where it is computed.
"""

import torch
from einops import rearrange
from jaxtyping import Float
from torch import Tensor


def segment_log_decay(
    rates: Float[Tensor, "batch key_pos head"], n_query: int | None = None
) -> Float[Tensor, "batch head query_pos key_pos"]:
    """`sum_{r=s+1..t} rates_r` at `(t, s)` for `s <= t`, `-inf` after (no mixing); the rows
    of the last `n_query` positions `t` (all of them by default: a cache's new positions).

    Each row sums the rates from its own position back: a cumulative sum, from the right,
    of the row holding `rates_r` for `r <= t`. Sums of the rates themselves, never
    differences of running totals, so that no cancellation loses precision on long
    sequences."""
    n_pos = rates.shape[1]
    keys = torch.arange(n_pos, device=rates.device)
    queries = keys[n_pos - (n_pos if n_query is None else n_query) :]
    after = keys[None, :] > queries[:, None]  # r > t: not in row t's sums; s > t: -inf
    row = rearrange(rates, "batch key_pos head -> batch head 1 key_pos").masked_fill(after, 0.0)
    from_here = row.flip(-1).cumsum(-1).flip(-1)  # sum_{r >= s}
    from_next = torch.nn.functional.pad(from_here[..., 1:], (0, 1))  # sum_{r >= s+1}
    return from_next.masked_fill(after, -torch.inf)
