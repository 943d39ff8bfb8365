"""TransformerLens's norm components with TL's constructors `(cfg, length=None)`, over ours.

The classes are `hookedattn`'s (`hook_scale`, `hook_normalized`, gains `w`, biases `b`),
built from a config or a dict of its fields, over `length` features (default `d_model`),
with TL's initial gain 1 and bias 0.
"""

from typing import Any

import torch

from hookedattn.core.components import norm as _core
from hookedattn_tl.config import HookedTransformerConfig


def _built(norm: Any, cls: type, cfg: Any, length: int | None) -> None:
    cfg = HookedTransformerConfig.unwrap(cfg)
    cls.__init__(norm, cfg, None if length is None else (length,))
    norm.cfg = cfg
    with torch.no_grad():
        for name, parameter in norm.named_parameters(recurse=False):
            parameter.fill_(1.0 if name == "w" else 0.0)


class LayerNorm(_core.LayerNorm):
    """TL's `LayerNorm(cfg, length=None)`: centre, scale, gain `w`, bias `b`."""

    def __init__(self, cfg: Any, length: int | None = None) -> None:
        _built(self, _core.LayerNorm, cfg, length)


class LayerNormPre(_core.LayerNormPre):
    """TL's `LayerNormPre(cfg)`: centre and scale, no gain or bias (folded away)."""

    def __init__(self, cfg: Any, length: int | None = None) -> None:
        _built(self, _core.LayerNormPre, cfg, length)


class RMSNorm(_core.RMSNorm):
    """TL's `RMSNorm(cfg, length=None)`: scale by the root mean square, gain `w`."""

    def __init__(self, cfg: Any, length: int | None = None) -> None:
        _built(self, _core.RMSNorm, cfg, length)


class RMSNormPre(_core.RMSNormPre):
    """TL's `RMSNormPre(cfg)`: scale by the root mean square, no gain."""

    def __init__(self, cfg: Any, length: int | None = None) -> None:
        _built(self, _core.RMSNormPre, cfg, length)


__all__ = ["LayerNorm", "LayerNormPre", "RMSNorm", "RMSNormPre"]
