"""Which blocks mix positions by attention and which by another sublayer (a hybrid model).

A hybrid model's blocks all have the same shape, `resid_mid = resid_pre + x(ln1(resid_pre))`,
but in some blocks the sublayer `x` that moves information between positions is not
attention: a gated short convolution (LFM2's), a Mamba-1 selective state-space layer
(Mamba, Falcon Mamba, Jamba), a Mamba-2 one (Bamba, Granite 4 hybrids, Mamba 2), a gated
delta net (Qwen3-Next) or Griffin's RG-LRU block (RecurrentGemma). Such a sublayer reads
the normed stream and writes one vector per position back, like attention, so it takes
attention's place in the block and its write passes `hook_attn_out` (the residual
decomposition sums as before); it has no heads, and the analyses that need heads refuse its
layers by name.

`MixerConfig` says which kind each block holds (`layers`) and the settings of each kind;
the model's config carries it as one field (`HookedTransformerConfig.mixers`). In Falcon-H1
a Mamba-2 mixer runs beside the attention in every block instead (`beside_attention`): both
read the same normed stream and the block adds both writes (`ParallelMixerBlock`). In
Nemotron-H each layer holds one sublayer, attention, a Mamba-2 mixer or an MLP: a block
without an MLP (`mlp_layers`) or without a sublayer that mixes positions ("none").
"""

import dataclasses
import math
from typing import Any

MIXER_KINDS: tuple[str, ...] = (
    "attention", "short_conv", "mamba2", "mamba", "gated_delta", "rg_lru", "kimi_delta",
    "lightning", "none",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class MixerConfig:
    """The sublayer kind of each block and the settings of the kinds that are not attention.

    - `layers`: one of `MIXER_KINDS` per block; "none": the block mixes no positions (no
      `ln1`, no `hook_attn_out`: an MLP-only block, Nemotron-H's MLP layers).
    - `mlp_layers`: whether each block holds an MLP; None: every block (or none, in an
      attention-only model). A block needs at least one of the two sublayers.
    - `d_conv`: the causal depthwise convolution's width (both kinds have one);
      `conv_bias`: whether it has a bias.
    - "short_conv" (LFM2): `x @ W_in` split into `b, c, h` (each `d_model` wide), then
      `c * conv(b * h)` and `@ W_out`; `proj_bias`: whether both projections have biases.
    - "mamba2" (Dao and Gu 2024, section 7's SSD layer): `n_ssm_heads` heads of width
      `d_ssm_head`, a state of `d_state` per head row, `n_ssm_groups` groups of heads
      sharing the input and output maps `B` and `C`; the step `dt` is clamped to
      `[dt_min, dt_max]`; `ssm_norm_eps` is the gated RMSNorm's epsilon (over each group's
      channels); `proj_bias` as above; `ssm_gated_norm`: whether that gated RMSNorm is
      there (Falcon-H1's `mamba_rms_norm=False`: `y * silu(z)` goes to `W_out` as it is).
    - "mamba" (Gu and Dao 2023, section 3's selective SSM, "S6"): `d_inner` channels, each
      with its own step `dt` and its own decays `A[channel, :]` over a state of `d_state`,
      so that each channel is a Mamba-2 head of width one with a vector of decays:
      `n_ssm_heads = d_inner`, `d_ssm_head = 1`, `n_ssm_groups = 1` (`B`, `C` shared
      by every channel). `dt_rank`: the width of the step's low-rank projection;
      `bcdt_norm`: whether `B`, `C` and that low-rank step pass an RMSNorm (Falcon Mamba's,
      Jamba's; epsilon `ssm_norm_eps`).
    - "gated_delta" (Yang, Kautz and Hatamizadeh 2024, `components.gated_delta`): the same
      settings in the delta rule's roles: `n_ssm_heads` value heads of width `d_ssm_head`,
      `n_ssm_groups` key heads of width `d_state` (each serving a run of consecutive value
      heads), so a state of `d_state x d_ssm_head` per value head; `ssm_norm_eps` is the
      gated RMSNorm's (over each head's channels); `delta_beta_scale` multiplies the step
      `beta` (2 where its eigenvalues may be negative, OLMo Hybrid's); `dt_min`, `dt_max`
      are unused.
    - "rg_lru" (Griffin's recurrent block, `components.rg_lru`): `n_ssm_heads` blocks of
      `d_ssm_head` channels for its block-diagonal gates (`d_inner` channels in all);
      `d_conv`, `conv_bias`, `proj_bias` as above.
    - "kimi_delta" (Kimi Delta Attention, `components.kimi_delta`): `n_ssm_heads` heads whose
      keys and values are both `d_ssm_head` wide (`d_state`, `n_ssm_groups` unused); the
      decay's and the output gate's low-rank maps `dt_rank` wide; `ssm_norm_eps` is the
      gated RMSNorm's (over each head's channels). `kda_full_rank_gates`: the two gates
      read the stream by one `d_model x d_inner` map each (`W_f`, `W_g`: Bailing Hybrid),
      not by low-rank pairs; `kda_decay_bound` (a negative number; None: off) bounds the
      decay, `g = bound * sigmoid(exp(A_log) * u)` in place of `-exp(A_log) softplus(u)`
      (Bailing Hybrid's "safe gate", its `kda_lower_bound`).
    - "lightning" (MiniMax's lightning attention, `components.lightning`): `n_ssm_heads`
      heads whose queries, keys and values are all `d_ssm_head` wide, each decayed by its
      own fixed rate (a parameter, `decay_rate`); `ssm_norm_eps` is the RMSNorm's over all
      heads' channels; `d_conv`, `d_state`, `n_ssm_groups` unused.
      `lightning_decay_float32`: each decay `exp(-rate * distance)` computed in float32 in
      every dtype, as MiniMax's reference builds its decay tables once, in float32.
    - `beside_attention`: a mixer kind that every block whose `layers` entry is "attention"
      runs beside its attention (Falcon-H1's parallel pair); None: none.
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
    dt_rank: int = 1
    bcdt_norm: bool = False
    ssm_gated_norm: bool = True
    beside_attention: str | None = None
    mlp_layers: tuple[bool, ...] | None = None
    delta_beta_scale: float = 1.0
    kda_full_rank_gates: bool = False
    kda_decay_bound: float | None = None
    lightning_decay_float32: bool = False

    def __post_init__(self) -> None:
        unknown = [k for k in self.layers if k not in MIXER_KINDS]
        if unknown:
            raise ValueError(f"unknown mixer kinds {unknown} in layers; valid: {MIXER_KINDS}")
        for name in ("d_conv", "n_ssm_heads", "d_ssm_head", "d_state", "n_ssm_groups", "dt_rank"):
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
        self._check_layouts()
        if not self.ssm_norm_eps > 0:
            raise ValueError(f"ssm_norm_eps must be > 0, got {self.ssm_norm_eps}")
        if self.kda_decay_bound is not None and not self.kda_decay_bound < 0:
            raise ValueError(
                f"kda_decay_bound must be negative (the log of the smallest decay), got "
                f"{self.kda_decay_bound}"
            )
        if "mamba" in self.layers and (self.d_ssm_head, self.n_ssm_groups) != (1, 1):
            raise ValueError(
                f"a Mamba-1 mixer's heads are its channels: it needs d_ssm_head=1 and "
                f"n_ssm_groups=1, got {self.d_ssm_head} and {self.n_ssm_groups}"
            )

    def _check_layouts(self) -> None:
        """`mlp_layers` one per layer, no block without a sublayer, a known kind beside
        attention."""
        if self.mlp_layers is not None:
            if len(self.mlp_layers) != len(self.layers):
                raise ValueError(
                    f"mlp_layers has {len(self.mlp_layers)} entries for {len(self.layers)} "
                    "layers: give one per layer"
                )
            empty = [i for i, k in enumerate(self.layers) if k == "none" and not self.mlp_layers[i]]
            if empty:
                raise ValueError(
                    f"blocks {empty} would hold no sublayer: neither a mixing one (layers[i] "
                    "'none') nor an MLP (mlp_layers[i] False)"
                )
        beside = (None, *(k for k in MIXER_KINDS[1:] if k != "none"))
        if self.beside_attention not in beside:
            raise ValueError(f"beside_attention={self.beside_attention!r}; valid: {beside}")

    @property
    def holds_mixers(self) -> bool:
        """Whether any block holds a sublayer that is not attention (in attention's place or
        beside it): such a sublayer keeps a cache of its own kind (`kv_cache.MixerCacheEntry`)
        and is not split over ranks."""
        return self.beside_attention is not None or set(self.layers) != {"attention"}

    def layer_mixers(self, layer: int) -> tuple[str, ...]:
        """The kinds of mixer block `layer` holds (not attention): none, one in attention's
        place, or one beside it."""
        kind = self.layers[layer]
        if kind == "attention":
            return () if self.beside_attention is None else (self.beside_attention,)
        return () if kind == "none" else (kind,)

    def holds_mlp(self, layer: int) -> bool:
        """Whether block `layer` holds an MLP, as far as `mlp_layers` says (the model's
        config says whether any does: `HookedTransformerConfig.layer_has_mlp`)."""
        return self.mlp_layers is None or bool(self.mlp_layers[layer])

    @property
    def d_inner(self) -> int:
        """A Mamba layer's inner width: `n_ssm_heads * d_ssm_head`."""
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
            mlp_layers = value.get("mlp_layers")
            return cls(
                **value
                | {
                    "layers": tuple(value.get("layers", ())),
                    "mlp_layers": None if mlp_layers is None else tuple(mlp_layers),
                }
            )
        raise TypeError(f"mixers must be a MixerConfig, a dict or None, got {type(value).__name__}")
