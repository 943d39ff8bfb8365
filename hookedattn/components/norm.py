"""Normalisation layers: LayerNorm, RMSNorm, and their weightless "Pre" forms.

Each records its divisor at `hook_scale` (`[batch pos 1]`) and its output at
`hook_normalized`. `hook_normalized` is always the layer's output, after the learned gain
and bias. (TransformerLens records RMSNorm's `hook_normalized` before the gain but
LayerNorm's after it; one meaning for one name is easier to decompose through.)

The "Pre" forms have no weights: they are what remains after the gain and bias have been
folded into the next layer's weights (`hookedattn.fold_layer_norm`).
"""

import torch
from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.config import HookedTransformerConfig
from hookedattn.hook_points import HookPoint


class LayerNormPre(nn.Module):
    """`(x - mean(x)) / sqrt(var(x) + eps)`, with no gain or bias."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        self.eps = cfg.eps
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(
        self, x: Float[Tensor, "batch pos *head d_model"]
    ) -> Float[Tensor, "batch pos *head d_model"]:
        x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale)


class LayerNorm(LayerNormPre):
    """`w * (x - mean(x)) / sqrt(var(x) + eps) + b`."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__(cfg)
        self.w = nn.Parameter(torch.ones(cfg.d_model, dtype=cfg.dtype, device=cfg.device))
        self.b = nn.Parameter(torch.zeros(cfg.d_model, dtype=cfg.dtype, device=cfg.device))

    def forward(
        self, x: Float[Tensor, "batch pos *head d_model"]
    ) -> Float[Tensor, "batch pos *head d_model"]:
        x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale * self.w + self.b)


class RMSNormPre(nn.Module):
    """`x / sqrt(mean(x^2) + eps)`, with no gain: no centring, as in T5 and LLaMA."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        self.eps = cfg.eps
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(
        self, x: Float[Tensor, "batch pos *head d_model"]
    ) -> Float[Tensor, "batch pos *head d_model"]:
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale)


class RMSNorm(RMSNormPre):
    """`w * x / sqrt(mean(x^2) + eps)`."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__(cfg)
        self.w = nn.Parameter(torch.ones(cfg.d_model, dtype=cfg.dtype, device=cfg.device))

    def forward(
        self, x: Float[Tensor, "batch pos *head d_model"]
    ) -> Float[Tensor, "batch pos *head d_model"]:
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale * self.w)


_NORMS: dict[str | None, type[nn.Module]] = {
    "LN": LayerNorm,
    "LNPre": LayerNormPre,
    "RMS": RMSNorm,
    "RMSPre": RMSNormPre,
}


def make_norm(cfg: HookedTransformerConfig) -> nn.Module:
    """The norm module the config asks for; `nn.Identity` when `normalization_type` is None."""
    if cfg.normalization_type is None:
        return nn.Identity()
    return _NORMS[cfg.normalization_type](cfg)
