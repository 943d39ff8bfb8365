"""Which blocks mix positions by attention and which by another sublayer (a hybrid model).

A hybrid model's blocks all have the same shape, `resid_mid = resid_pre + x(ln1(resid_pre))`,
but in some blocks the sublayer `x` that moves information between positions is not
attention: a gated short convolution (LFM2's) or a Mamba-2 state-space layer (Bamba,
Granite 4 hybrids, Mamba 2). Such a sublayer reads the normed stream and writes one vector
per position back, like attention, so it takes attention's place in the block and its
write passes `hook_attn_out` (the residual decomposition sums as before); it has no heads,
and the analyses that need heads refuse its layers by name.

`MixerConfig` says which kind each block holds (`layers`) and the settings of each kind;
the model's config carries it as one field (`HookedTransformerConfig.mixers`).
"""

import dataclasses
import math
from typing import Any

MIXER_KINDS: tuple[str, ...] = ("attention", "short_conv", "mamba2", "gated_delta")


@dataclasses.dataclass(frozen=True)
class MixerConfig:
    """The sublayer kind of each block and the settings of the kinds that are not attention.

    - `layers`: one of `MIXER_KINDS` per block.
    - `d_conv`: the causal depthwise convolution's width (both kinds have one);
      `conv_bias`: whether it has a bias.
    - "short_conv" (LFM2): `x @ W_in` split into `b, c, h` (each `d_model` wide), then
      `c * conv(b * h)` and `@ W_out`; `proj_bias`: whether both projections have biases.
    - "mamba2" (Dao and Gu 2024, section 7's SSD layer): `n_ssm_heads` heads of width
      `d_ssm_head`, a state of `d_state` per head row, `n_ssm_groups` groups of heads
      sharing the input and output maps `B` and `C`; the step `dt` is clamped to
      `[dt_min, dt_max]`; `ssm_norm_eps` is the gated RMSNorm's epsilon (over each group's
      channels); `proj_bias` as above.
    - "gated_delta" (Yang, Kautz and Hatamizadeh 2024, `components.gated_delta`): the same
      settings in the delta rule's roles: `n_ssm_heads` value heads of width `d_ssm_head`,
      `n_ssm_groups` key heads of width `d_state` (each serving a run of consecutive value
      heads), so a state of `d_state x d_ssm_head` per value head; `ssm_norm_eps` is the
      gated RMSNorm's (over each head's channels); `delta_beta_scale` multiplies the step
      `beta` (2 where its eigenvalues may be negative, OLMo Hybrid's); `dt_min`, `dt_max`
      are unused.
    """

    layers: tuple[str, ...]
    d_conv: int = 4
    conv_bias: bool = False
    proj_bias: bool = False
    n_ssm_heads: int = 1
    d_ssm_head: int = 1
    d_state: int = 1
    n_ssm_groups: int = 1
    dt_min: float = 0.0
    dt_max: float = math.inf
    ssm_norm_eps: float = 1e-5
    delta_beta_scale: float = 1.0

    def __post_init__(self) -> None:
        unknown = [k for k in self.layers if k not in MIXER_KINDS]
        if unknown:
            raise ValueError(f"unknown mixer kinds {unknown} in layers; valid: {MIXER_KINDS}")
        for name in ("d_conv", "n_ssm_heads", "d_ssm_head", "d_state", "n_ssm_groups"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.n_ssm_heads % self.n_ssm_groups:
            raise ValueError(
                f"n_ssm_groups={self.n_ssm_groups} must divide n_ssm_heads={self.n_ssm_heads}: "
                f"each group serves a whole set of heads"
            )
        if not 0.0 <= self.dt_min <= self.dt_max:
            raise ValueError(f"need 0 <= dt_min <= dt_max, got {self.dt_min}, {self.dt_max}")
        if not self.ssm_norm_eps > 0:
            raise ValueError(f"ssm_norm_eps must be > 0, got {self.ssm_norm_eps}")

    @property
    def d_inner(self) -> int:
        """A Mamba-2 layer's inner width: `n_ssm_heads * d_ssm_head`."""
        return self.n_ssm_heads * self.d_ssm_head

    @classmethod
    def coerce(cls, value: Any) -> "MixerConfig | None":
        """`value` as a MixerConfig: itself, or rebuilt from its dict (JSON); None stays None."""
        if value is None or isinstance(value, cls):
            return value
        if isinstance(value, dict):
            known = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ValueError(f"unknown mixer settings {unknown}; known: {sorted(known)}")
            return cls(**value | {"layers": tuple(value.get("layers", ()))})
        raise TypeError(f"mixers must be a MixerConfig, a dict or None, got {type(value).__name__}")
