"""The Mamba-2 mixer (Dao and Gu 2024, "Transformers are SSMs"), a sublayer that mixes
positions by a state-space recurrence in place of attention (Bamba, Granite 4 hybrids,
Mamba 2).

From the normed stream `x`, per position:

    z   = x @ W_z + b_z                                    the output gate   [d_inner]
    u   = silu(causal_conv(x @ W_xBC + b_xBC))             then split into
          xs [ssm_head d_ssm_head], B [group d_state], C [group d_state]
    dt  = clamp(softplus(x @ W_dt + b_dt + dt_bias), dt_min, dt_max)     [ssm_head]
    A   = -exp(A_log)                                                    [ssm_head]

and per head `h` (reading the `B`, `C` of its group), a state `S` of `d_ssm_head x d_state`:

    S_t = exp(dt_t A) S_{t-1} + dt_t xs_t B_t^T,    y_t = S_t C_t + D xs_t

Unrolled, the recurrence is a causal mix of the positions (the paper's SSD, its section 3):

    y_t = sum_{s <= t} M[t, s] xs_s + D xs_t,
    M[t, s] = (C_t . B_s) exp(sum_{r = s+1..t} dt_r A) dt_s

`M` plays the part of an attention pattern (`hook_mixing`: [batch ssm_head query_pos
key_pos]; its rows need not sum to one). Where a hook reads it, this module computes `y`
that way, one product as in attention; otherwise, as attention runs fused where its pattern
is unread, in runs of 64 positions, each from the state the run before left (`ssd_chunk`,
`ssd_rule`: the SSD's chunked form, memory linear in the positions). The tests check both
against the recurrence run position by position. Then
the gated RMSNorm, over each group's `d_inner / n_ssm_groups` channels,

    out = rmsnorm(y * silu(z)) * w_norm @ W_out + b_out

(Falcon-H1 may leave the norm out, `ssm_gated_norm=False`: `out = (y * silu(z)) @ W_out +
b_out`, and the mixer has no `w_norm`.)

Written out, memory is `[batch ssm_head pos pos]`, as an eager attention's pattern. With a
cache (`kv_cache.MixerCacheEntry`) the entry carries the state and keeps every position's
`xs`, `B` and `dt` (what `M`'s rows read, should a later step's hook read them); a forward
computes its own positions' reads, and its convolution reads the inputs the cache carried
(`causal_conv_continued`).
"""

from einops import einsum, rearrange, repeat
from jaxtyping import Bool, Float
from torch import Tensor, nn
from torch.nn.functional import silu, softplus

from hookedattn.core import kernels
from hookedattn.core.components.causal_conv import causal_conv_continued, real_positions
from hookedattn.core.components.decay import segment_log_decay
from hookedattn.core.components.embed import _param, affine, affine_params
from hookedattn.core.components.norm import mean_square, rms_normalized
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.kernels import AttentionContext
from hookedattn.core.kv_cache import NO_PAST, MixerCacheEntry
from hookedattn.core.shapes import Resid

Mixing = Float[Tensor, "batch ssm_head query_pos key_pos"]
State = Float[Tensor, "batch ssm_head d_ssm_head d_state"]
# Positions per run of `ssd_chunk` where the mixing matrix is not read: memory and time
# `pos x CHUNK` per head rather than `pos x pos`.
CHUNK = 64


def ssd_mixing(
    dt: Float[Tensor, "batch key_pos ssm_head"],
    A: Float[Tensor, " ssm_head"],
    B: Float[Tensor, "batch key_pos group d_state"],
    C: Float[Tensor, "batch query_pos group d_state"],
) -> Mixing:
    """`M[t, s] = (C_t . B_s) exp(sum_{r=s+1..t} dt_r A) dt_s` for `s <= t`, 0 after; the
    rows of the positions `C` is given for, the last ones (all, or a cache's new ones)."""
    return _ssd_parts(dt, A, B, C)[0]


def _ssd_parts(
    dt: Float[Tensor, "batch key_pos ssm_head"],
    A: Float[Tensor, " ssm_head"],
    B: Float[Tensor, "batch key_pos group d_state"],
    C: Float[Tensor, "batch query_pos group d_state"],
) -> tuple[Mixing, Mixing]:
    """`ssd_mixing`'s `M`, and the decays `exp(sum_{r=s+1..t} dt_r A)` it is made with."""
    heads_per_group = A.shape[0] // B.shape[2]
    decay = segment_log_decay(dt * A, C.shape[1]).exp()  # 0 where s > t
    CB = einsum(C, B, "batch query_pos group d_state, batch key_pos group d_state "
                "-> batch group query_pos key_pos")  # fmt: skip
    CB = repeat(CB, "batch group query_pos key_pos -> batch (group per_group) query_pos key_pos",
                per_group=heads_per_group)  # fmt: skip
    step = rearrange(dt, "batch key_pos ssm_head -> batch ssm_head 1 key_pos")
    return CB * decay * step, decay


def ssd_chunk(
    xs: Float[Tensor, "batch pos ssm_head d_ssm_head"],
    dt: Float[Tensor, "batch pos ssm_head"],
    A: Float[Tensor, " ssm_head"],
    B: Float[Tensor, "batch pos group d_state"],
    C: Float[Tensor, "batch pos group d_state"],
    real: Bool[Tensor, "#batch pos 1"],
    state: State | None = None,
) -> tuple[Float[Tensor, "batch pos ssm_head d_ssm_head"], State]:
    """The mixed reads `sum_s M[t, s] xs_s` of a run of positions and the state after its
    last, from `state`, the one the positions before them left (none: zero):

        y_t = gamma_t S_0 C_t + sum_{s <= t} M[t, s] xs_s
        S_n = gamma_n S_0 + sum_s exp(sum_{r=s+1..n} dt_r A) dt_s xs_s B_s^T

    with `gamma_t = exp((dt_1 + ... + dt_t) A)`, the decay since the run began; `M` is
    `ssd_mixing` over the run, and a padding position (`real` 0) writes nothing."""
    per_group = A.shape[0] // B.shape[2]
    mixing, decay = _ssd_parts(dt, A, B, C)
    mixing = mixing * rearrange(real, "batch key_pos 1 -> batch 1 1 key_pos")
    y = einsum(mixing, xs, "batch ssm_head query_pos key_pos, batch key_pos ssm_head d_ssm_head "
               "-> batch query_pos ssm_head d_ssm_head")  # fmt: skip
    heads = "batch pos group d_state -> batch pos (group per_group) d_state"
    B, C = (repeat(t, heads, per_group=per_group) for t in (B, C))
    to_last = decay[:, :, -1]  # exp(sum_{r=s+1..n} dt_r A): the last query's row
    written = to_last * rearrange(dt * real, "batch pos ssm_head -> batch ssm_head pos")
    new_state = einsum(written, xs, B, "batch ssm_head pos, batch pos ssm_head d_ssm_head, "
                       "batch pos ssm_head d_state "
                       "-> batch ssm_head d_ssm_head d_state")  # fmt: skip
    if state is not None:
        gamma = (dt * A).cumsum(1).exp()  # from the run's start: no difference of totals
        read = einsum(C, state, "batch pos ssm_head d_state, batch ssm_head d_ssm_head d_state "
                      "-> batch pos ssm_head d_ssm_head")  # fmt: skip
        y = y + gamma[..., None] * read
        new_state = new_state + gamma[:, -1, :, None, None] * state
    return y, new_state


def ssd_rule(
    xs: Float[Tensor, "batch pos ssm_head d_ssm_head"],
    dt: Float[Tensor, "batch pos ssm_head"],
    A: Float[Tensor, " ssm_head"],
    B: Float[Tensor, "batch pos group d_state"],
    C: Float[Tensor, "batch pos group d_state"],
    real: Bool[Tensor, "#batch pos 1"],
    state: State | None = None,
    chunk: int = CHUNK,
) -> tuple[Float[Tensor, "batch pos ssm_head d_ssm_head"], State]:
    """`ssd_chunk` over runs of `chunk` positions, each from the state the one before it
    left (the SSD's chunked form): the same reads and state to rounding, in memory linear
    in the positions."""
    step = lambda xs, dt, B, C, real, state: ssd_chunk(xs, dt, A, B, C, real, state)
    return kernels.in_runs(step, (xs, dt, B, C, real), state, chunk)


class Mamba2Mixer(nn.Module):
    """The Mamba-2 mixer (module docstring). Hook points: `hook_in` (the normed stream it
    reads), `hook_mixing` (`M`), `hook_out` (what it writes, before any post-norm)."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        m = cfg.mixers
        self.settings = m
        d_xbc = m.d_inner + 2 * m.n_ssm_groups * m.d_state
        self.hook_in = HookPoint()
        self.W_z, self.b_z = affine_params(cfg.d_model, m.d_inner, cfg)
        self.W_xBC, self.b_xBC = affine_params(cfg.d_model, d_xbc, cfg)
        self.W_dt, self.b_dt = affine_params(cfg.d_model, m.n_ssm_heads, cfg)
        self.W_conv, self.b_conv = _param(d_xbc, m.d_conv, cfg=cfg), _param(d_xbc, cfg=cfg)
        self.dt_bias = _param(m.n_ssm_heads, cfg=cfg)
        self.A_log = _param(m.n_ssm_heads, cfg=cfg)
        self.D = _param(m.n_ssm_heads, cfg=cfg)
        self.hook_mixing = HookPoint()
        self.fused = cfg.use_fused_kernels  # the SSD from its state where M is unread
        self.output_norm = self._no_norm
        if m.ssm_gated_norm:
            self.w_norm = _param(m.d_inner, cfg=cfg)
            self.output_norm = self._gated_norm
        self.W_out, self.b_out = affine_params(m.d_inner, cfg.d_model, cfg)
        self.hook_out = HookPoint()

    def forward(
        self, x: Resid, context: AttentionContext, past: MixerCacheEntry = NO_PAST
    ) -> Resid:
        m = self.settings
        x = self.enter(self.hook_in(x))
        real = real_positions(context, x.shape[1])  # no real token reads padding
        z = affine(x, self.W_z, self.b_z)
        xBC = affine(x, *self.xbc_weights()) * real
        u = silu(causal_conv_continued(xBC, *self.conv_weights(), past))
        widths = [m.d_inner, m.n_ssm_groups * m.d_state, m.n_ssm_groups * m.d_state]
        xs, B, C = u.split(widths, dim=-1)
        xs = rearrange(xs, "batch pos (ssm_head d_ssm_head) -> batch pos ssm_head d_ssm_head",
                       ssm_head=m.n_ssm_heads)  # fmt: skip
        B, C = (rearrange(t, "batch pos (group d_state) -> batch pos group d_state",
                          group=m.n_ssm_groups) for t in (B, C))  # fmt: skip
        dt = softplus(affine(x, self.W_dt, self.b_dt) + self.dt_bias).clamp(m.dt_min, m.dt_max)
        y = xs * rearrange(self.D, "ssm_head -> ssm_head 1")
        y = y + self._mixed(xs, dt, B, C, real, context, past)
        flat = "batch pos ssm_head d_ssm_head -> batch pos (ssm_head d_ssm_head)"
        gated = rearrange(y, flat) * silu(z)
        return self.hook_out(self.write(self.output_norm(gated)))

    # The steps a split mixer replaces (`parallel._mixers`): where the stream enters the
    # heads, which channels of the fused `xBC` and its convolution they read, how the heads'
    # writes add up, over which channels the gated norm takes its mean.
    def enter(self, x: Resid) -> Resid:
        """The stream the heads read: itself."""
        return x

    def xbc_weights(self) -> tuple[Float[Tensor, "d_model channel"], Float[Tensor, " channel"]]:
        """The weight and bias of `xBC`'s channels: `xs`'s, then `B`'s, then `C`'s."""
        return self.W_xBC, self.b_xBC

    def conv_weights(self) -> tuple[Float[Tensor, "channel d_conv"], Float[Tensor, " channel"]]:
        """The convolution's weight and bias over `xBC`'s channels."""
        return self.W_conv, self.b_conv

    def write(self, gated: Float[Tensor, "batch pos d_inner"]) -> Resid:
        """The heads' write: `gated @ W_out + b_out`, a sum over the heads' channels."""
        return affine(gated, self.W_out, self.b_out)

    def group_mean_square(self, x: Float[Tensor, "batch pos group channel"]) -> Tensor:
        """The gated norm's mean of squares over each group's channels."""
        return mean_square(x)

    def _mixed(
        self,
        xs: Float[Tensor, "batch pos ssm_head d_ssm_head"],
        dt: Float[Tensor, "batch pos ssm_head"],
        B: Float[Tensor, "batch pos group d_state"],
        C: Float[Tensor, "batch pos group d_state"],
        real: Bool[Tensor, "#batch pos 1"],
        context: AttentionContext,
        past: MixerCacheEntry,
    ) -> Float[Tensor, "batch pos ssm_head d_ssm_head"]:
        """The new positions' `sum_s M[t, s] xs_s` (`kernels.mix`): by `ssd_rule` from the
        state the cache carried, or, where a hook reads the mixing matrix, written out over
        every position, from the cache's `xs`, `B` and `dt` and these."""
        A = -self.A_log.exp()
        every = past.rows("xs", xs), past.rows("B", B), past.rows("dt", dt)

        def written_out() -> Float[Tensor, "batch pos ssm_head d_ssm_head"]:
            xs_all, B_all, dt_all = every
            readable = rearrange(real_positions(context), "batch key_pos 1 -> batch 1 1 key_pos")
            mixing = self.hook_mixing(ssd_mixing(dt_all, A, B_all, C) * readable)
            return einsum(mixing, xs_all, "batch ssm_head query_pos key_pos, batch key_pos "
                          "ssm_head d_ssm_head -> batch query_pos ssm_head d_ssm_head")  # fmt: skip

        by_state = lambda state: ssd_rule(xs, dt, A, B, C, real, state)
        return kernels.mix(self.hook_mixing, self.fused, past, by_state, written_out)

    def _gated_norm(
        self, g: Float[Tensor, "batch pos d_inner"]
    ) -> Float[Tensor, "batch pos d_inner"]:
        """The gated RMSNorm's output: `rmsnorm(g) * w_norm`, over each group's channels."""
        return self._group_rms_norm(g) * self.w_norm

    def _no_norm(self, g: Float[Tensor, "batch pos d_inner"]) -> Float[Tensor, "batch pos d_inner"]:
        """No norm (`ssm_gated_norm=False`): the gated output as it is."""
        return g

    def _group_rms_norm(
        self, g: Float[Tensor, "batch pos d_inner"]
    ) -> Float[Tensor, "batch pos d_inner"]:
        """`g / rms(g)` over each group's channels (without the gain)."""
        m = self.settings
        grouped = rearrange(
            g, "batch pos (group channel) -> batch pos group channel", group=m.n_ssm_groups
        )
        normed = rms_normalized(grouped, m.ssm_norm_eps, self.group_mean_square)
        return rearrange(normed, "batch pos group channel -> batch pos (group channel)")
