"""A causal depthwise convolution along the positions: each channel mixes its own last
`d_conv` values,

    y[t, c] = sum_k W_conv[c, k] * u[t - (d_conv - 1) + k, c] + b_conv[c],   u[< 0] = 0,

so tap `d_conv - 1` reads the current position and tap 0 the oldest. The short-convolution
and Mamba-2 mixers (`short_conv`, `mamba2`) both read their inputs through one.

In a padded batch no real token may read a padding position, as in attention: the mixers
zero their convolution's input there (`real_positions`), so that a left-padded prompt's
tokens see zeros before it, exactly as the prompt run alone does.

With a cache (`kv_cache.MixerCacheEntry`) a forward's positions follow earlier ones: the
cache carries the last `d_conv - 1` inputs from one forward to the next, and the
convolution reads them before the new ones (`causal_conv_continued`).
"""

import torch
from einops import einsum
from jaxtyping import Bool, Float
from torch import Tensor, nn

from hookedattn.core.kernels import AttentionContext
from hookedattn.core.kv_cache import MixerCacheEntry


def causal_conv(
    u: Float[Tensor, "batch pos channel"],
    W_conv: Float[Tensor, "channel d_conv"],
    b_conv: Float[Tensor, " channel"],
) -> Float[Tensor, "batch pos channel"]:
    """The equation above: the positions before the first read as zeros."""
    d_conv = W_conv.shape[-1]
    padded = nn.functional.pad(u, (0, 0, d_conv - 1, 0))  # d_conv - 1 zero positions first
    windows = padded.unfold(1, d_conv, 1)  # [batch pos channel d_conv]: each position's past
    taps = "batch pos channel d_conv, channel d_conv -> batch pos channel"
    return einsum(windows, W_conv, taps) + b_conv


def causal_conv_continued(
    u: Float[Tensor, "batch pos channel"],
    W_conv: Float[Tensor, "channel d_conv"],
    b_conv: Float[Tensor, " channel"],
    past: MixerCacheEntry,
    name: str = "conv",
) -> Float[Tensor, "batch pos channel"]:
    """`causal_conv` of `u` after the inputs `past` carries as `name` from earlier
    positions (none: zeros), at `u`'s positions; carries `u`'s last `d_conv - 1` on."""
    earlier, reach = past.carried(name), W_conv.shape[-1] - 1
    window = u if earlier is None else torch.cat([earlier, u], dim=1)
    past.carry(name, window[:, max(0, window.shape[1] - reach) :])
    return causal_conv(window, W_conv, b_conv)[:, window.shape[1] - u.shape[1] :]


def real_positions(
    context: AttentionContext, n_last: int | None = None
) -> Bool[Tensor, "#batch pos 1"]:
    """True at the positions a real token may read, False at padding (the keys the last query may
    not read: with left padding, the padding; with right padding the last query is itself
    padding, and what it cannot read comes after every real token anyway); every position
    the keys cover, or the last `n_last` (a forward's own after a cache's)."""
    readable = ~context.blocked["global"][:, 0, -1, :]
    if n_last is not None:
        readable = readable[:, readable.shape[1] - n_last :]
    return readable[..., None]
