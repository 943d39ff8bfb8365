"""Normalisation layers: LayerNorm, RMSNorm, their weightless "Pre" forms, and no norm.

Each records its divisor at `hook_scale` and its output at `hook_normalized`.
`hook_normalized` is always the layer's output, after the learned gain and bias. (In
TransformerLens it is the output before the gain; one meaning for one name, the value the
next layer reads, is what an exact decomposition sums to.)

A norm normalises over the trailing axes of its `shape`: `(d_model,)` for the residual
stream (scale `[batch pos 1]`), `(d_head,)` for each head's queries or keys (scale `[batch
pos head 1]`), `(head, d_head)` for all heads' queries together (scale `[batch pos 1 1]`).

The "Pre" forms have no weights: they are what remains after the gain and bias have been
folded into the next layer's weights (`hookedattn.fold_layer_norm`).
"""

import torch
from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.config import HookedTransformerConfig
from hookedattn.hook_points import HookPoint

Normed = Float[Tensor, "batch pos *rest"]


class NoNorm(nn.Module):
    """The identity, where a model has no norm; called as a plain function (no hooks)."""

    def __call__(self, x: Tensor) -> Tensor:
        return x

    forward = __call__


class LayerNormPre(nn.Module):
    """`(x - mean(x)) / sqrt(var(x) + eps)`, with no gain or bias."""

    def __init__(self, cfg: HookedTransformerConfig, shape: tuple[int, ...] | None = None) -> None:
        super().__init__()
        self.eps = cfg.eps
        self.axes = tuple(range(-len(shape or (cfg.d_model,)), 0))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(self, x: Normed) -> Normed:
        x = x - x.mean(self.axes, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(self.axes, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(self.affine(x / scale))

    def affine(self, x: Normed) -> Normed:
        """The learned gain and bias (none here)."""
        return x


class LayerNorm(LayerNormPre):
    """`w * (x - mean(x)) / sqrt(var(x) + eps) + b`."""

    def __init__(self, cfg: HookedTransformerConfig, shape: tuple[int, ...] | None = None) -> None:
        super().__init__(cfg, shape)
        shape = shape or (cfg.d_model,)
        self.w = nn.Parameter(torch.ones(shape, dtype=cfg.dtype, device=cfg.device))
        self.b = nn.Parameter(torch.zeros(shape, dtype=cfg.dtype, device=cfg.device))

    def affine(self, x: Normed) -> Normed:
        """`x * w + b`."""
        return x * self.w + self.b


class RMSNormPre(nn.Module):
    """`x / sqrt(mean(x^2) + eps)`, with no gain: no centring, as in T5 and LLaMA."""

    def __init__(self, cfg: HookedTransformerConfig, shape: tuple[int, ...] | None = None) -> None:
        super().__init__()
        self.eps = cfg.eps
        self.axes = tuple(range(-len(shape or (cfg.d_model,)), 0))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(self, x: Normed) -> Normed:
        scale = self.hook_scale((x.pow(2).mean(self.axes, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(self.affine(x / scale))

    def affine(self, x: Normed) -> Normed:
        """The learned gain (none here)."""
        return x


class RMSNorm(RMSNormPre):
    """`w * x / sqrt(mean(x^2) + eps)`. Gemma's `(1 + w)` gain is stored as `w` on import."""

    def __init__(self, cfg: HookedTransformerConfig, shape: tuple[int, ...] | None = None) -> None:
        super().__init__(cfg, shape)
        shape = shape or (cfg.d_model,)
        self.w = nn.Parameter(torch.ones(shape, dtype=cfg.dtype, device=cfg.device))

    def affine(self, x: Normed) -> Normed:
        """`x * w`."""
        return x * self.w


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


def make_placed_norm(cfg: HookedTransformerConfig, where: str) -> nn.Module:
    """The norm before ("pre") or after ("post") a sublayer, if the config places one there."""
    placed = cfg.normalization_placement in (where, "pre_and_post")
    return make_norm(cfg) if placed else NoNorm()
