"""A block's output stream multiplied by a learned scalar of its own (Gemma 4's
`layer_scalar`: `resid_post = w * (resid_mid + mlp_out)`).

The scalar multiplies the whole stream, the skip path too, so it is no sublayer's write:
`hook_in` holds the unscaled sum, which the sublayers' writes still sum to
(`resid_mid + mlp_out`), and the block's `hook_resid_post` the scaled stream the next block
reads. A scalar, not folded into any weight: the next block's norms have an epsilon, and
the skip path carries the stream on unnormed, so no weight can absorb it exactly.
"""

import torch
from torch import nn

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.shapes import Resid


class ResidScale(nn.Module):
    """`w * x` of the stream a block leaves, `w` one learned number (`[1]`, as stored)."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(1, dtype=cfg.dtype, device=cfg.device))
        self.hook_in = HookPoint()  # [batch pos d_model], the unscaled stream

    def forward(self, resid: Resid) -> Resid:
        return self.w * self.hook_in(resid)
