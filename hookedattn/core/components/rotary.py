"""Rotary positional embedding (Su et al. 2021), GPT-NeoX layout.

Queries and keys are rotated by an angle proportional to their position, in pairs of
dimensions `(i, i + rotary_dim / 2)`, so that `q_i . k_j` depends on positions only through
`i - j`. Dimensions past `rotary_dim` pass through unrotated (GPT-NeoX's `rotary_pct`).

The frequencies are `base ** (-2i / rotary_dim)`, computed in float32 exactly as the
reference implementations of the families we import compute them (the models were trained
with these numbers), divided by `rotary_scaling_factor` (linear scaling) or split into
Llama 3's frequency bands (Meta's "NTK by parts": long wavelengths slowed by the factor,
short ones kept, a smooth blend between) or YaRN's (Peng et al. 2023, section 3.2: the same
idea with the band edges counted in rotations over the original context, and a linear ramp
between). Angles `position * frequency` and their cosines are float32 too (float64 in a
float64 model: the frequencies are the trained constants, the arithmetic on them is the
model's; `rotary_table_float32` keeps them float32, as GPT-J's table is), multiplied by
`rotary_attention_factor` (YaRN's temperature, 1 elsewhere: since both queries and keys
are rotated, the scores scale by its square), then cast to the model's dtype.

A model with `rotary_base_local` rotates its local (windowed) layers by a rotary of their
own (Gemma 3: base 10k locally, 1M with linear scaling globally): plain frequencies of that
base, divided by `rotary_scaling_factor_local`.
"""

import math

import torch
from einops import rearrange
from jaxtyping import Float, Int
from torch import Tensor, nn

from hookedattn.core.config import HookedTransformerConfig


def rotary_frequencies(cfg: HookedTransformerConfig, local: bool = False) -> Float[Tensor, " half"]:
    """The angular frequency of each rotated pair of dimensions, float32 (of the local
    layers' own rotary when `local` and the model has one)."""
    if local and cfg.rotary_base_local is not None:
        local_freq = _plain(cfg.rotary_base_local, cfg.rotary_dim)
        return _linear(local_freq, cfg.rotary_scaling_factor_local)
    inv_freq = _plain(cfg.rotary_base, cfg.rotary_dim)
    if cfg.use_NTK_by_parts_rope:
        return _still(_llama3_bands(inv_freq, cfg), cfg.rotary_pairs)
    if cfg.use_yarn_rope:
        return _still(_yarn_bands(cfg), cfg.rotary_pairs)
    return _still(_linear(inv_freq, cfg.rotary_scaling_factor), cfg.rotary_pairs)


def rotary_attention_factor(cfg: HookedTransformerConfig, local: bool = False) -> float:
    """What the cosines and sines are multiplied by: 1 for a local layer's own rotary."""
    return 1.0 if local and cfg.rotary_base_local is not None else cfg.rotary_attention_factor


def _plain(base: float, rotary_dim: int, dtype: torch.dtype = torch.float32) -> Tensor:
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(dtype) / rotary_dim
    return 1.0 / (base**exponents)


def _linear(inv_freq: Tensor, factor: float) -> Tensor:
    return inv_freq / factor if factor != 1.0 else inv_freq


def _still(inv_freq: Tensor, pairs: int | None) -> Tensor:
    """The first `pairs` frequencies, the rest 0 (`rotary_pairs`: those pairs never turn)."""
    return inv_freq if pairs is None else inv_freq * (torch.arange(len(inv_freq)) < pairs)


def _yarn_bands(cfg: HookedTransformerConfig) -> Tensor:
    """YaRN: each pair's frequency blends the original (`extrapolated`) and the one slowed by
    `yarn_factor` (`interpolated`), by a ramp over the pairs between the band edges, as HF
    computes it (`_compute_yarn_parameters`)."""
    dim, base, context = cfg.rotary_dim, cfg.rotary_base, cfg.yarn_original_ctx_len
    position_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    extrapolated = 1.0 / position_freqs
    interpolated = 1.0 / (cfg.yarn_factor * position_freqs)

    def edge(rotations: float) -> float:
        # The pair index at which a wavelength fits `rotations` times into the context.
        return (dim * math.log(context / (rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = edge(cfg.yarn_beta_fast), edge(cfg.yarn_beta_slow)
    if cfg.yarn_truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # HF's guard against a zero-width ramp
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    kept = 1 - ramp
    return interpolated * (1 - kept) + extrapolated * kept


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

    def __init__(self, cfg: HookedTransformerConfig, local: bool = False) -> None:
        super().__init__()
        self.rotary_dim = cfg.rotary_dim
        self.attention_factor = rotary_attention_factor(cfg, local)
        self.table_float32 = cfg.rotary_table_float32
        # RoFormer's table: frequencies and angles in float64, whatever the dtype.
        self.frequencies_float64 = (
            _plain(cfg.rotary_base, cfg.rotary_dim, torch.float64)
            if cfg.rotary_angles_float64
            else None
        )
        # A buffer, not a parameter: derived from the config, never saved or trained.
        self.register_buffer("inv_freq", rotary_frequencies(cfg, local), persistent=False)
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
        if self.frequencies_float64 is not None:
            inv_freq = self.frequencies_float64.to(positions.device)
        else:
            wide = dtype == torch.float64 and not self.table_float32
            inv_freq = self.inv_freq.to(torch.float64 if wide else torch.float32)
        angles = positions.to(inv_freq.dtype)[..., None] * inv_freq
        angles = rearrange(torch.cat([angles, angles], dim=-1), "batch pos rot -> batch pos 1 rot")
        cos, sin = angles.cos() * self.attention_factor, angles.sin() * self.attention_factor
        if self.table_float32:  # the reference's table, float32 in every dtype
            cos, sin = cos.float(), sin.float()
        cos, sin = cos.to(dtype), sin.to(dtype)
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
