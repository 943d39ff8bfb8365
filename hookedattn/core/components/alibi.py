"""Attention with linear biases, ALiBi (Press, Smith and Lewis 2022; BLOOM, MPT).

No positional embedding: each head's scores get a penalty linear in the distance from the
query back to the key, after the `1 / attn_scale` scale and before the mask,

    scores[h, q, k] = q . k / attn_scale + slope[h] * (position_k - position_q)

which is never positive on the keys a causal query reads. The slopes form a geometric
sequence, `slope[r] = 2 ** (-8 r / n)` for heads `r = 1..n` where `n` is a power of two
(section 3 of the paper). For other head counts BLOOM and MPT take the `n' = 2 ** floor(log2
n_heads)` slopes of that sequence, then the odd-numbered ones of the sequence for `2 n'`
(the slopes between them) for the heads left over; `alibi_slopes` in the config overrides
them (an import keeps the slopes its checkpoint was trained with, rounded as it rounds them).

`transformers` adds `slope * position_k` alone (BLOOM) or `slope * (k - (max_len - 1))`
(MPT): the same pattern, since adding one number to a whole row of scores leaves its softmax
as it is; `hook_attn_scores` here holds the paper's form, whose scores do not depend on how
long the sequence is. Positions count real tokens (`AttentionContext`), so padding moves
nothing and a KV cache's new queries sit after its keys.
"""

import math

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from hookedattn.core.config import HookedTransformerConfig


def alibi_slopes(n_heads: int) -> Float[Tensor, " head"]:
    """The paper's slopes for `n_heads` heads, float64 (module docstring)."""
    below = 2 ** math.floor(math.log2(n_heads))
    slopes = [2.0 ** (-8.0 * r / below) for r in range(1, below + 1)]
    between = [2.0 ** (-8.0 * r / (2 * below)) for r in range(1, 2 * below, 2)]
    return torch.tensor(slopes + between[: n_heads - below], dtype=torch.float64)


class ALiBi(nn.Module):
    """Adds each head's linear distance penalty to `[batch head query_pos key_pos]` scores."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        given = cfg.alibi_slopes
        slopes = alibi_slopes(cfg.n_heads)
        if given is not None:
            slopes = torch.tensor(given, dtype=torch.float64)
        # A buffer, not a parameter: derived from the config, never saved or trained.
        self.register_buffer("slopes", slopes, persistent=False)

    def forward(
        self,
        scores: Float[Tensor, "batch head query_pos key_pos"],
        query_positions: Int[Tensor, "batch query_pos"],
        key_positions: Int[Tensor, "batch key_pos"],
    ) -> Float[Tensor, "batch head query_pos key_pos"]:
        return scores + self.bias(query_positions, key_positions).to(scores.dtype)

    def bias(
        self,
        query_positions: Int[Tensor, "batch query_pos"],
        key_positions: Int[Tensor, "batch key_pos"],
    ) -> Float[Tensor, "batch head query_pos key_pos"]:
        """`slope[h] * (position_k - position_q)`, float64."""
        distance = key_positions[:, None, :] - query_positions[:, :, None]
        return self.slopes[None, :, None, None] * distance[:, None].to(torch.float64)
