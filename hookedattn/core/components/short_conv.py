"""The gated short convolution of LFM2 (Liquid AI's hybrids), a sublayer that mixes each
position with its last few in place of attention:

    b, c, h = x @ W_B + b_B,  x @ W_C + b_C,  x @ W_X + b_X      (each [batch pos d_model])
    y       = c * causal_conv(b * h)                               (`causal_conv`)
    out     = y @ W_out + b_out

The two gates are elementwise: the input gate `b` before the convolution, the output gate
`c` after it. Only the convolution moves information between positions, over a window of
`d_conv` positions (the current one included), so a position's write depends on no token
further back; with a cache the convolution reads the last `d_conv - 1` earlier inputs
(`causal_conv_continued`), all a new position needs.
"""

from torch import nn

from hookedattn.core.components.causal_conv import causal_conv_continued, real_positions
from hookedattn.core.components.embed import _param, affine, affine_params
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.kernels import AttentionContext
from hookedattn.core.kv_cache import NO_PAST, MixerCacheEntry
from hookedattn.core.shapes import Resid


class ShortConv(nn.Module):
    """The gated short convolution (module docstring). Hook points: `hook_in` (its input,
    the normed stream), `hook_conv` (the convolution's output, before the output gate),
    `hook_out` (what it writes, before any post-norm)."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        d_model, d_conv = cfg.d_model, cfg.mixers.d_conv
        self.hook_in = HookPoint()
        for gate in ("B", "C", "X"):
            W, b = affine_params(d_model, d_model, cfg)
            setattr(self, f"W_{gate}", W)
            setattr(self, f"b_{gate}", b)
        self.W_conv = _param(d_model, d_conv, cfg=cfg)
        self.b_conv = _param(d_model, cfg=cfg)
        self.hook_conv = HookPoint()
        self.W_out, self.b_out = affine_params(d_model, d_model, cfg)
        self.hook_out = HookPoint()

    def forward(
        self, x: Resid, context: AttentionContext, past: MixerCacheEntry = NO_PAST
    ) -> Resid:
        x = self.enter(self.hook_in(x))
        b, c = affine(x, self.W_B, self.b_B), affine(x, self.W_C, self.b_C)
        h = affine(x, self.W_X, self.b_X)
        gated_in = b * h * real_positions(context, x.shape[1])  # no real token reads padding
        conv = self.hook_conv(causal_conv_continued(gated_in, self.W_conv, self.b_conv, past))
        return self.hook_out(self.write(c * conv))

    # The steps a split mixer replaces (`parallel._mixers`).
    def enter(self, x: Resid) -> Resid:
        """The stream the channels read: itself."""
        return x

    def write(self, gated: Resid) -> Resid:
        """The channels' write: `gated @ W_out + b_out`, a sum over the channels."""
        return affine(gated, self.W_out, self.b_out)
