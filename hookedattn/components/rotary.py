"""Rotary positional embedding (Su et al. 2021), GPT-NeoX layout.

Queries and keys are rotated by an angle proportional to their position, in pairs of
dimensions `(i, i + rotary_dim / 2)`, so that `q_i . k_j` depends on positions only through
`i - j`. Dimensions past `rotary_dim` pass through unrotated.
"""

import torch
from einops import rearrange
from jaxtyping import Float, Int
from torch import Tensor, nn

from hookedattn.config import HookedTransformerConfig


class Rotary(nn.Module):
    """Rotates `[batch pos head d_head]` queries or keys by their positions."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        self.rotary_dim = cfg.rotary_dim
        half = cfg.rotary_dim // 2
        inv_freq = cfg.rotary_base ** (-torch.arange(half, dtype=torch.float64) / half)
        angles = torch.outer(torch.arange(cfg.n_ctx, dtype=torch.float64), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)  # the same angle for i and i + half
        # Buffers, not parameters: derived from the config, never saved or trained.
        self.register_buffer("cos", angles.cos().to(cfg.dtype), persistent=False)
        self.register_buffer("sin", angles.sin().to(cfg.dtype), persistent=False)

    def forward(
        self, x: Float[Tensor, "batch pos head d_head"], positions: Int[Tensor, "batch pos"]
    ) -> Float[Tensor, "batch pos head d_head"]:
        cos = rearrange(self.cos[positions], "batch pos rot -> batch pos 1 rot")
        sin = rearrange(self.sin[positions], "batch pos rot -> batch pos 1 rot")
        x_rot, x_pass = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        first, second = x_rot.chunk(2, dim=-1)
        rotated_half = torch.cat([-second, first], dim=-1)
        return torch.cat([x_rot * cos + rotated_half * sin, x_pass], dim=-1)
