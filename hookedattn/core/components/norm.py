"""Normalisation layers: LayerNorm, RMSNorm, their weightless "Pre" forms, and no norm.

Each records its divisor at `hook_scale`, the normalised stream before the learned gain
and bias at `hook_normalized` (as TransformerLens 3.x, for LayerNorm and RMSNorm alike), and
the layer's output after them at `hook_out`: the value the next layer reads, which is what an
exact decomposition through the norm sums to. Folding the gain and bias into the next weights
(`hookedattn.fold_layer_norm`) leaves `hook_normalized` unchanged and moves `hook_out`.

A norm normalises over the trailing axes of its `shape`: `(d_model,)` for the residual
stream (scale `[batch pos 1]`), `(d_head,)` for each head's queries or keys (scale `[batch
pos head 1]`), `(head, d_head)` for all heads' queries together (scale `[batch pos 1 1]`).

The "Pre" forms have no weights: they are what remains after the gain and bias have been
folded into the next layer's weights (`hookedattn.fold_layer_norm`).
"""

from collections.abc import Callable

import torch
from torch import Tensor, nn

from hookedattn.core import kernels
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.shapes import Normed


def mean_square(x: Tensor) -> Tensor:
    """`mean(x^2)` over the last axis, kept."""
    return x.pow(2).mean(-1, keepdim=True)


def rms_normalized(
    x: Tensor, eps: float, mean_of_squares: Callable[[Tensor], Tensor] = mean_square
) -> Tensor:
    """`x / sqrt(mean(x^2) + eps)` over the last axis, as a hybrid's mixers norm their heads'
    reads before the gate (weightless: the gain is theirs to apply). The mean of squares is
    taken in float32 at least, as `transformers` takes it: in half precision a square of a
    small read underflows. The result has `x`'s dtype. `mean_of_squares` takes the mean
    (a mixer whose channels are split over ranks takes it over every rank's)."""
    wide = x.to(torch.promote_types(x.dtype, torch.float32))
    return (wide * torch.rsqrt(mean_of_squares(wide) + eps)).to(x.dtype)


class NoNorm(nn.Module):
    """The identity, where a model has no norm; called as a plain function (no hooks)."""

    def __call__(self, x: Tensor) -> Tensor:
        return x

    forward = __call__


class _Norm(nn.Module):
    """What every norm shares: its axes, its hook points and its output.

    `written_out` is the norm's equation through its hook points; `kernels.normalize` runs
    it, or the same numbers by one fused kernel where neither point has a hook. The output
    passes `hook_out` either way.
    """

    centres = False  # whether the norm subtracts the mean first (LayerNorm) or not (RMS)

    def __init__(self, cfg: HookedTransformerConfig, shape: tuple[int, ...] | None = None) -> None:
        super().__init__()
        self.eps = cfg.eps
        self.shape = tuple(shape or (cfg.d_model,))
        self.axes = tuple(range(-len(self.shape), 0))
        self.fused = kernels.fuses_norms(cfg)
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()
        self.hook_out = HookPoint()

    def forward(self, x: Normed) -> Normed:
        return self.hook_out(kernels.normalize(self, x))  # `written_out`, or one fused kernel

    def written_out(self, x: Normed) -> Normed:
        """The norm step by step, through its hook points."""
        x = self.centred(x)
        scale = self.hook_scale((x.pow(2).mean(self.axes, keepdim=True) + self.eps).sqrt())
        return self.affine(self.hook_normalized(x / scale))

    def affine(self, x: Normed) -> Normed:
        """The learned gain and bias (none here)."""
        return x

    def weight_and_bias(self) -> tuple[Tensor | None, Tensor | None]:
        """The gain and bias, None where the norm has none (none here)."""
        return None, None


class LayerNormPre(_Norm):
    """`(x - mean(x)) / sqrt(var(x) + eps)`, with no gain or bias."""

    centres = True

    def centred(self, x: Normed) -> Normed:
        """`x - mean(x)` over the norm's axes (two plain passes: on a CPU the one-pass
        `var_mean` is slower)."""
        return x - x.mean(self.axes, keepdim=True)


class LayerNorm(LayerNormPre):
    """`w * (x - mean(x)) / sqrt(var(x) + eps) + b`."""

    def __init__(self, cfg: HookedTransformerConfig, shape: tuple[int, ...] | None = None) -> None:
        super().__init__(cfg, shape)
        self.w = nn.Parameter(torch.ones(self.shape, dtype=cfg.dtype, device=cfg.device))
        self.b = nn.Parameter(torch.zeros(self.shape, dtype=cfg.dtype, device=cfg.device))

    def affine(self, x: Normed) -> Normed:
        """`x * w + b`."""
        return x * self.w + self.b

    def weight_and_bias(self) -> tuple[Tensor | None, Tensor | None]:
        """The gain and bias."""
        return self.w, self.b


class RMSNormPre(_Norm):
    """`x / sqrt(mean(x^2) + eps)`, with no gain: no centring, as in T5 and LLaMA."""

    def centred(self, x: Normed) -> Normed:
        """`x` itself: an RMS norm does not centre."""
        return x


class RMSNorm(RMSNormPre):
    """`w * x / sqrt(mean(x^2) + eps)`. Gemma's `(1 + w)` gain is stored as `w` on import."""

    def __init__(self, cfg: HookedTransformerConfig, shape: tuple[int, ...] | None = None) -> None:
        super().__init__(cfg, shape)
        self.w = nn.Parameter(torch.ones(self.shape, dtype=cfg.dtype, device=cfg.device))

    def affine(self, x: Normed) -> Normed:
        """`x * w`."""
        return x * self.w

    def weight_and_bias(self) -> tuple[Tensor | None, Tensor | None]:
        """The gain, and no bias."""
        return self.w, None


_NORMS: dict[str, type[nn.Module]] = {
    "LN": LayerNorm,
    "LNPre": LayerNormPre,
    "RMS": RMSNorm,
    "RMSPre": RMSNormPre,
}


def make_norm(cfg: HookedTransformerConfig, shape: tuple[int, ...] | None = None) -> nn.Module:
    """The norm module the config asks for, over `shape`; `NoNorm` when there is none."""
    if cfg.normalization_type is None:
        return NoNorm()
    return _NORMS[cfg.normalization_type](cfg, shape)


def make_embed_norm(cfg: HookedTransformerConfig) -> nn.Module:
    """The norm of the embeddings before the first block (`embed_norm`), or none; over
    their width, which a projection may change after it (`d_embed`)."""
    return make_norm(cfg, (cfg.embed_width,)) if cfg.embed_norm else NoNorm()


def make_final_norm(cfg: HookedTransformerConfig) -> nn.Module:
    """The norm before the unembedding; none after post-residual norms, whose last one
    (`ln_resid_post` of the last block) already normed the stream."""
    if cfg.normalization_placement == "post_residual":
        return NoNorm()
    return make_norm(cfg)


def make_ln1(cfg: HookedTransformerConfig, layer: int) -> nn.Module:
    """Block `layer`'s norm before its attention: the placed pre-norm, or none in a block
    whose `ln1_layers` flag is off (it reads a stream normed already)."""
    return make_placed_norm(cfg, "pre", layer) if cfg.layer_norms_attn_input(layer) else NoNorm()


def make_ln2_post(cfg: HookedTransformerConfig, layer: int) -> nn.Module:
    """Block `layer`'s norm after its MLP: the placed post-norm, or (`moe_out_norm`) in a
    block with experts the norm of the mixture's whole output (A.X-K1's), which is as much
    a part of what the sublayer writes."""
    if cfg.moe_out_norm and cfg.layer_is_moe(layer):
        return make_norm(cfg)
    return make_placed_norm(cfg, "post", layer)


def make_placed_norm(cfg: HookedTransformerConfig, where: str, layer: int) -> nn.Module:
    """The norm before ("pre") or after ("post") a sublayer of block `layer`, if the config
    places one there (`layer_placement`)."""
    placed = cfg.layer_placement(layer) in (where, "pre_and_post")
    return make_norm(cfg) if placed else NoNorm()
