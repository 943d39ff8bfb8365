"""Query temperature tuning: queries sharpened by position where nothing else marks it.

Llama 4's blocks without rotary positions (its "NoPE" blocks) read keys with no notion of
distance, so over a long context their softmax spreads thin. They multiply every query by a
factor that grows with its position (Nakanishi 2025, "Scalable-Softmax Is Superior for
Attention"; Llama 4's `attn_temperature_tuning`):

    tau(p)  = 1 + scale * log(1 + floor((p + 1) / floor_))      p: the query's position
    q_tuned = tau(p) * q                                         (attn.hook_q_tuned)

`floor_` is the config's `query_temperature_floor` (Llama 4's `floor_scale`, 8192), `scale`
its `query_temperature_scale` (`attn_scale`, 0.1): the factor is 1 for the first `floor_ - 1`
positions and steps up once every `floor_` positions after. The factor is one number per
position, the same for every head and dimension, so the per-head queries at `hook_q_tuned`
are what the scores read (the keys are not scaled). `p` counts the real tokens before the
query (`AttentionContext.positions`: a left-padded prompt gets the positions it has alone;
`transformers` counts stored positions, padding included, which differs only with padding).
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.shapes import HeadVectors


class QueryTemperature(nn.Module):
    """`tau(p) * q` per query position (module docstring); no parameters."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        self.floor_positions = cfg.query_temperature_floor
        self.scale = cfg.query_temperature_scale

    def factor(self, positions: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos"]:
        """`tau(p) = 1 + scale * log(1 + floor((p + 1) / floor_))`, in float64 (rounded to
        the queries' dtype by `forward`)."""
        steps = torch.div(positions + 1, self.floor_positions, rounding_mode="floor")
        return 1 + self.scale * torch.log1p(steps.to(torch.float64))

    def forward(self, q: HeadVectors, positions: Int[Tensor, "batch pos"]) -> HeadVectors:
        """Each query times its position's factor."""
        return q * self.factor(positions).to(q.dtype)[:, :, None, None]
