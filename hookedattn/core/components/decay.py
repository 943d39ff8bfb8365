"""The decay between two positions of a state-space or linear-attention mixer, as a matrix.

A recurrence `S_t = exp(a_t) S_{t-1} + ...` carries what position `s` wrote to position
`t >= s` multiplied by `exp(sum_{r=s+1..t} a_r)`. Mamba-2's SSD mixing (`mamba2`, with
`a_r = dt_r A`) and the gated delta net's (`gated_delta`, with `a_r = g_r`) both need that
sum for every pair `(t, s)`, one matrix per head; this is where it is computed.
"""

import torch
from einops import repeat
from jaxtyping import Float
from torch import Tensor


def segment_log_decay(
    rates: Float[Tensor, "batch pos head"],
) -> Float[Tensor, "batch head query_pos key_pos"]:
    """`sum_{r=s+1..t} rates_r` at `(t, s)` for `s <= t`, `-inf` after (no mixing).

    A cumulative sum down the columns of the matrix holding `rates_r` at `(r, s)` for
    `r > s`: sums of the rates themselves, never differences of running totals, so that no
    cancellation loses precision on long sequences."""
    n_pos = rates.shape[1]
    causal = torch.ones(n_pos, n_pos, dtype=torch.bool, device=rates.device).tril()  # s <= t
    rows = "batch pos head -> batch head pos key_pos"  # rates_r at row r, every column s
    later = repeat(rates, rows, key_pos=n_pos) * causal.tril(-1)  # r > s
    return later.cumsum(dim=-2).masked_fill(~causal, -torch.inf)
