"""The Mamba-1 mixer (Gu and Dao 2023, "Mamba", section 3's selective state-space layer,
"S6"), a sublayer that mixes positions by a recurrence in place of attention (Mamba,
Falcon Mamba, Jamba's hybrids).

From the normed stream `x`, per position:

    z   = x @ W_z + b_z                                      the output gate   [d_inner]
    xs  = silu(causal_conv(x @ W_xs + b_xs))                 the SSM's input   [d_inner]
    B   = norm_B(xs @ W_B),   C = norm_C(xs @ W_C)                             [d_state]
    dt  = softplus(norm_dt(xs @ W_dt_down) @ W_dt_up + b_dt)  a low-rank step [d_inner]
    A   = -exp(A_log)                                                [d_inner d_state]

(the norms are RMSNorms over their vector in Falcon Mamba and Jamba, identities in Mamba);
and per channel `c`, a state `h[c]` of `d_state` (the paper's equation 2a, 2b with its
zero-order-hold `A` and Euler `B`, section 2):

    h_t[c] = exp(dt_t[c] A[c]) * h_{t-1}[c] + dt_t[c] xs_t[c] B_t,    h_{-1} = 0
    y_t[c] = C_t . h_t[c] + D[c] xs_t[c]

    out = (y * silu(z)) @ W_out + b_out

The recurrence runs as a scan along the positions (`selective_scan`). Unrolled, it is a causal
mix of the positions, `y_t[c] = sum_{s <= t} M[c, t, s] xs_s[c] + D[c] xs_t[c]` with
`M[c, t, s] = sum_n C_t[n] B_s[n] exp(sum_{r=s+1..t} dt_r[c] A[c, n]) dt_s[c]`, as Mamba-2's
(`mamba2`) is; but here each channel has its own `M`, one sum over the state per entry, and
building it holds `[batch d_inner d_state pos pos]`: at Mamba-130m's width (1,536 channels,
a state of 16) and 1,024 tokens, 6 GiB for `M` alone in float32 and 16 times that on the way,
per layer, where the scan holds the states, `[batch pos d_inner d_state]` (96 MiB). So no
`hook_mixing` here: `hook_state` holds every `h_t`, and `y` reads them; the tests check the
scan against `M` built densely and against a loop over channels and positions.

In a padded batch `xs` is zero at padding (as the convolution's input is,
`real_positions`): a padding position adds nothing to any state. With a cache
(`kv_cache.MixerCacheEntry`) the scan starts from the state the last forward carried on,
and the convolution reads the inputs it carried (`causal_conv_continued`).
"""

import torch
from einops import einsum
from jaxtyping import Float
from torch import Tensor, nn
from torch.nn.functional import silu, softplus

from hookedattn.core.components.causal_conv import causal_conv_continued, real_positions
from hookedattn.core.components.embed import _param, affine, affine_params
from hookedattn.core.components.norm import rms_normalized
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.kernels import AttentionContext
from hookedattn.core.kv_cache import NO_PAST, MixerCacheEntry
from hookedattn.core.shapes import Resid

States = Float[Tensor, "batch pos d_inner d_state"]


def selective_scan(
    dt: Float[Tensor, "batch pos d_inner"],
    A: Float[Tensor, "d_inner d_state"],
    B: Float[Tensor, "batch pos d_state"],
    xs: Float[Tensor, "batch pos d_inner"],
    start: Float[Tensor, "batch d_inner d_state"] | None = None,
) -> States:
    """Every state `h_t = exp(dt_t A) * h_{t-1} + dt_t xs_t B_t` (per channel), from
    `h_{-1} = start` (zero by default)."""
    per_state = "batch pos d_inner d_state"
    decay = torch.exp(einsum(dt, A, f"batch pos d_inner, d_inner d_state -> {per_state}"))
    drive = einsum(dt * xs, B, f"batch pos d_inner, batch pos d_state -> {per_state}")
    state = torch.zeros_like(drive[:, 0]) if start is None else start
    states = []
    for t in range(drive.shape[1]):  # a recurrence: each state needs the one before
        state = decay[:, t] * state + drive[:, t]
        states.append(state)
    return torch.stack(states, dim=1)


class _GainRMSNorm(nn.Module):
    """`v / rms(v) * w` over the last axis (Falcon Mamba's B, C, dt norms keep no gain: theirs
    import as ones)."""

    def __init__(self, width: int, eps: float, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        self.eps = eps
        self.w = _param(width, cfg=cfg)

    def forward(self, v: Float[Tensor, "... width"]) -> Float[Tensor, "... width"]:
        return rms_normalized(v, self.eps) * self.w


def _bcdt_norm(width: int, cfg: HookedTransformerConfig) -> nn.Module:
    """The norm of `B`, `C` or the low-rank step: an RMSNorm where `bcdt_norm`, else none."""
    m = cfg.mixers
    return _GainRMSNorm(width, m.ssm_norm_eps, cfg) if m.bcdt_norm else nn.Identity()


class MambaMixer(nn.Module):
    """The Mamba-1 mixer (module docstring). Hook points: `hook_in` (the normed stream it
    reads), `hook_state` (every `h_t`), `hook_out` (what it writes, before any post-norm)."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        m = self.settings = cfg.mixers
        d_inner, d_state = m.d_inner, m.d_state
        self.hook_in = HookPoint()
        self.W_xs, self.b_xs = affine_params(cfg.d_model, d_inner, cfg)
        self.W_z, self.b_z = affine_params(cfg.d_model, d_inner, cfg)
        self.W_conv, self.b_conv = _param(d_inner, m.d_conv, cfg=cfg), _param(d_inner, cfg=cfg)
        self.W_B, self.W_C = _param(d_inner, d_state, cfg=cfg), _param(d_inner, d_state, cfg=cfg)
        self.W_dt_down = _param(d_inner, m.dt_rank, cfg=cfg)
        self.W_dt_up, self.b_dt = affine_params(m.dt_rank, d_inner, cfg)
        self.norm_B, self.norm_C = _bcdt_norm(d_state, cfg), _bcdt_norm(d_state, cfg)
        self.norm_dt = _bcdt_norm(m.dt_rank, cfg)
        self.A_log, self.D = _param(d_inner, d_state, cfg=cfg), _param(d_inner, cfg=cfg)
        self.hook_state = HookPoint()
        self.W_out, self.b_out = affine_params(d_inner, cfg.d_model, cfg)
        self.hook_out = HookPoint()

    def forward(
        self, x: Resid, context: AttentionContext, past: MixerCacheEntry = NO_PAST
    ) -> Resid:
        x = self.enter(self.hook_in(x))
        real = real_positions(context, x.shape[1])  # no real token reads padding
        z = affine(x, self.W_z, self.b_z)
        xs = affine(x, self.W_xs, self.b_xs) * real
        xs = silu(causal_conv_continued(xs, self.W_conv, self.b_conv, past))
        xs = xs * real  # a padding position adds nothing to the states
        B, C, dt_low = self.channel_reads(xs)
        B, C = self.norm_B(B), self.norm_C(C)
        dt = softplus(affine(self.norm_dt(dt_low), self.W_dt_up, self.b_dt))
        states = selective_scan(dt, -self.A_log.exp(), B, xs, past.carried("state"))
        past.carry("state", states[:, -1])  # as the scan left it, before any hook's edit
        states = self.hook_state(states)
        y = einsum(states, C, "batch pos d_inner d_state, batch pos d_state -> batch pos d_inner")
        y = y + xs * self.D
        return self.hook_out(self.write(y * silu(z)))

    # The steps a split mixer replaces (`parallel._mixers`): where the stream enters the
    # channels, the reads that sum over every channel, how the channels' writes add up.
    def enter(self, x: Resid) -> Resid:
        """The stream the channels read: itself."""
        return x

    def channel_reads(
        self, xs: Float[Tensor, "batch pos d_inner"]
    ) -> tuple[Tensor, Tensor, Tensor]:
        """`xs @ W_B`, `xs @ W_C` and `xs @ W_dt_down`: `B`, `C` and the low-rank step
        before their norms, each a sum over the channels."""
        return xs @ self.W_B, xs @ self.W_C, xs @ self.W_dt_down

    def write(self, gated: Float[Tensor, "batch pos d_inner"]) -> Resid:
        """The channels' write: `gated @ W_out + b_out`, a sum over the channels."""
        return affine(gated, self.W_out, self.b_out)
