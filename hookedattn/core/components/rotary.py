"""Rotary positional embedding (Su et al. 2021), GPT-NeoX layout.

Queries and keys are rotated by an angle proportional to their position, in pairs of
dimensions `(i, i + rotary_dim / 2)`, so that `q_i . k_j` depends on positions only through
`i - j`. Dimensions past `rotary_dim` pass through unrotated (GPT-NeoX's `rotary_pct`).

The frequencies are `base ** (-2i / rotary_dim)`, computed in float32 exactly as the
reference implementations of the families we import compute them (the models were trained
with these numbers), divided by `rotary_scaling_factor` (linear scaling) or split into
Llama 3's frequency bands (Meta's "NTK by parts": long wavelengths slowed by the factor,
short ones kept, a smooth blend between). Angles `position * frequency` and their cosines
are float32 too, then cast to the model's dtype.
"""

import math

import torch
from einops import rearrange
from jaxtyping import Float, Int
from torch import Tensor, nn

from hookedattn.core.config import HookedTransformerConfig


def rotary_frequencies(cfg: HookedTransformerConfig) -> Float[Tensor, " half"]:
    """The angular frequency of each rotated pair of dimensions, float32."""
    exponents = torch.arange(0, cfg.rotary_dim, 2, dtype=torch.int64).float() / cfg.rotary_dim
    inv_freq = 1.0 / (cfg.rotary_base**exponents)
    if cfg.use_NTK_by_parts_rope:
        return _llama3_bands(inv_freq, cfg)
    return inv_freq / cfg.rotary_scaling_factor if cfg.rotary_scaling_factor != 1.0 else inv_freq


def _llama3_bands(inv_freq: Tensor, cfg: HookedTransformerConfig) -> Tensor:
    factor, context = cfg.NTK_by_parts_factor, cfg.NTK_original_ctx_len
    low, high = cfg.NTK_by_parts_low_freq_factor, cfg.NTK_by_parts_high_freq_factor
    wavelength = 2 * math.pi / inv_freq
    slowed = torch.where(wavelength > context / low, inv_freq / factor, inv_freq)
    smooth = (context / wavelength - low) / (high - low)
    blended = (1 - smooth) * slowed / factor + smooth * slowed
    medium = ~(wavelength < context / high) * ~(wavelength > context / low)
    return torch.where(medium, blended, slowed)


class Rotary(nn.Module):
    """Rotates `[batch pos head d_head]` queries or keys by their positions."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        self.rotary_dim = cfg.rotary_dim
        # A buffer, not a parameter: derived from the config, never saved or trained.
        self.register_buffer("inv_freq", rotary_frequencies(cfg), persistent=False)
        # The cosines of the last positions seen: every layer of one forward rotates by the
        # same positions, so the angles are computed once per forward, not once per layer.
        self._memo: tuple[Tensor, torch.dtype, Tensor, Tensor] | None = None

    def cos_sin(
        self, positions: Int[Tensor, "batch pos"], dtype: torch.dtype
    ) -> tuple[Float[Tensor, "batch pos 1 rot"], Float[Tensor, "batch pos 1 rot"]]:
        """`cos` and `sin` of every position's angles, each angle twice (for `i`, `i + half`)."""
        memo = self._memo
        if memo is not None and memo[0] is positions and memo[1] == dtype:
            return memo[2], memo[3]
        angles = positions.float()[..., None] * self.inv_freq.float()
        angles = rearrange(torch.cat([angles, angles], dim=-1), "batch pos rot -> batch pos 1 rot")
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        self._memo = (positions, dtype, cos, sin)
        return cos, sin

    def forward(
        self, x: Float[Tensor, "batch pos head d_head"], positions: Int[Tensor, "batch pos"]
    ) -> Float[Tensor, "batch pos head d_head"]:
        return self.rotate(x, *self.cos_sin(positions, x.dtype))

    def rotate(
        self,
        x: Float[Tensor, "batch pos head d_head"],
        cos: Float[Tensor, "#batch pos 1 rot"],
        sin: Float[Tensor, "#batch pos 1 rot"],
    ) -> Float[Tensor, "batch pos head d_head"]:
        """`x` rotated by the angles whose `cos` and `sin` are given (from `cos_sin`)."""
        x_rot, x_pass = x[..., : self.rotary_dim], x[..., self.rotary_dim :]
        first, second = x_rot.chunk(2, dim=-1)
        rotated_half = torch.cat([-second, first], dim=-1)
        return torch.cat([x_rot * cos + rotated_half * sin, x_pass], dim=-1)
