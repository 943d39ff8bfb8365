"""How a norm runs: its equation written out, or one fused kernel.

The equation is the norm's `written_out` (centre, divide by the scale, apply the gain and
bias, through `hook_scale` and `hook_normalized`). Where neither of those points has a
hook in a forward, torch's `layer_norm` / `rms_norm` kernel computes the same numbers (to
rounding) in one pass; `use_fused_kernels=False` writes every norm out always.
"""

from typing import Any

import torch

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.kernels._deferred import defer
from hookedattn.core.shapes import Normed


def fuses_norms(cfg: HookedTransformerConfig) -> bool:
    """Whether norms built from `cfg` may run as one fused kernel (when unread)."""
    return cfg.use_fused_kernels


def normalize(norm: Any, x: Normed) -> Normed:
    """`norm`'s output: `norm.written_out(x)`, or the same numbers by one fused kernel where
    `norm.fused` and neither `hook_scale` nor `hook_normalized` has a hook that needs the
    value now (one that can wait gets `x`: `_deferred`)."""
    scale, normalized = norm.hook_scale, norm.hook_normalized
    if not norm.fused or scale.needs_value or normalized.needs_value:
        return norm.written_out(x)
    if scale.is_active or normalized.is_active:  # read later, from the input (`_deferred`)
        defer(norm, (x,), scale, normalized)
    return fused_normalize(norm, x)


def fused_normalize(norm: Any, x: Normed) -> Normed:
    """`norm`'s output by one fused kernel, whatever is attached to its hook points: the
    numbers of `written_out` to rounding (for a caller that records the written-out
    `hook_scale` and `hook_normalized` otherwise, as the decode step does after the last
    step)."""
    # torch's own ops, not `nn.functional`'s wrappers: the same kernels, without a Python
    # frame and a read of cuDNN's flag per call (a tensor subclass's `__torch_function__`
    # still sees the call, as `torch.layer_norm`).
    w, b = norm.weight_and_bias()
    if norm.centres:
        return torch.layer_norm(x, norm.shape, w, b, norm.eps)
    return torch.rms_norm(x, norm.shape, w, norm.eps)
