"""Kimi Delta Attention (Kimi Team 2025, "Kimi Linear"), the gated delta net
(`components.gated_delta`) with a decay per key channel rather than per head: a sublayer
that mixes positions by a delta-rule recurrence in place of attention (Kimi Linear).

From the normed stream `x`, per position (`n_ssm_heads` heads, keys and values both
`d_ssm_head` wide, the two gates' low-rank maps `dt_rank` wide):

    q, k, v = silu(causal_conv([x @ W_q + b_q; x @ W_k + b_k; x @ W_v + b_v]))
    q, k    = q / (|q| sqrt(d_head)), k / |k|                 (|u| = sqrt(u . u + 1e-6))
    g       = -exp(A_log) * softplus((x @ W_f_down + b_f_down) @ W_f_up + dt_bias)
                                                   [head d_head], one decay per key channel
    beta    = sigmoid(x @ W_b + b_b)                                               [head]
    z       = (x @ W_g_down + b_g_down) @ W_g_up                 the output gate [head d_head]

Bailing Hybrid (Ling 3) reads its two gates by one full map each, `u_f = x @ W_f + b_f` and
`z = x @ W_g + b_g` (`kda_full_rank_gates`), and bounds the decay (its "safe gate",
`kda_decay_bound = b < 0`): `g = b * sigmoid(exp(A_log) * (u_f + dt_bias))`, so that each
step keeps between `exp(b)` and all of a channel's memory.

Per head, a state `S` of `d_head x d_head` (key channel by value channel), each key row
decayed by its own `exp(g_t)` and then corrected towards `v_t` along `k_t` (the delta rule):

    S'  = diag(exp(g_t)) S_{t-1},   S_t = S' + beta_t k_t (v_t - S'^T k_t)^T,   o_t = S_t^T q_t
    out = (rmsnorm(o) * w_norm * sigmoid(z)) @ W_out + b_out   (the norm over each head)

A per-channel decay has no per-head mixing matrix as the gated delta net's (each pair of
positions would need one matrix per channel), so the recurrence runs as a scan along the
positions, one state per head at a time (all the states would be `d_head^2` per head and
position). Hook points: `hook_decay` holds every `g` (the log of each channel's decay),
`hook_beta` every step `beta`, `hook_o` what the heads read before the gated norm.

In a padded batch `beta` and the convolution's input are zero at padding: a padding
position writes nothing into the state. With a cache (`kv_cache.MixerCacheEntry`) the
scan starts from the state the last forward carried on, and the convolution reads the
inputs it carried (`causal_conv_continued`).
"""

import torch
from einops import einsum, rearrange
from jaxtyping import Float
from torch import Tensor, nn
from torch.nn.functional import sigmoid, silu, softplus

from hookedattn.core.components.causal_conv import causal_conv_continued, real_positions
from hookedattn.core.components.embed import _param, affine, affine_params
from hookedattn.core.components.gated_delta import _unit
from hookedattn.core.components.norm import rms_normalized
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.kernels import AttentionContext
from hookedattn.core.kv_cache import NO_PAST, MixerCacheEntry
from hookedattn.core.mixer_config import MixerConfig
from hookedattn.core.shapes import Resid

Heads = Float[Tensor, "batch pos ssm_head d_ssm_head"]
Inner = Float[Tensor, "batch pos d_inner"]
State = Float[Tensor, "batch ssm_head d_key d_value"]


def kimi_delta_scan(
    q: Heads,
    k: Heads,
    v: Heads,
    g: Heads,
    beta: Float[Tensor, "batch pos ssm_head"],
    start: State | None = None,
) -> tuple[Heads, State]:
    """Every `o_t = S_t^T q_t` of the recurrence in the module docstring, from `S_{-1} =
    start` (zero by default), and the last state."""
    batch, n_pos, heads, d_key = k.shape
    state = k.new_zeros(batch, heads, d_key, v.shape[-1]) if start is None else start
    read = "batch head d_key d_value, batch head d_key -> batch head d_value"  # S^T u
    outer = "batch head d_key, batch head d_value -> batch head d_key d_value"
    outputs = []
    for t in range(n_pos):  # a recurrence: each state needs the one before
        state = state * g[:, t, :, :, None].exp()  # each key row by its own decay
        written = beta[:, t, :, None] * (v[:, t] - einsum(state, k[:, t], read))
        state = state + einsum(k[:, t], written, outer)
        outputs.append(einsum(state, q[:, t], read))
    return torch.stack(outputs, dim=1), state


class KimiDeltaAttention(nn.Module):
    """Kimi Delta Attention (module docstring). Hook points: `hook_in` (the normed stream it
    reads), `hook_decay` (`g`), `hook_beta`, `hook_o` (the heads' reads), `hook_out` (what
    it writes, before any post-norm)."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        m = self.settings = cfg.mixers
        self.hook_in = HookPoint()
        for name in _input_maps(m):
            W, b = affine_params(cfg.d_model, _input_width(m, name), cfg)
            setattr(self, f"W_{name}", W)
            setattr(self, f"b_{name}", b)
        self.gate_inputs = self._full_rank_gates
        if not m.kda_full_rank_gates:
            self.W_f_up, self.W_g_up = (
                _param(m.dt_rank, m.d_inner, cfg=cfg),
                _param(m.dt_rank, m.d_inner, cfg=cfg),
            )
            self.gate_inputs = self._low_rank_gates
        self.decay = self._softplus_decay if m.kda_decay_bound is None else self._bounded_decay
        self.W_conv, self.b_conv = (
            _param(3 * m.d_inner, m.d_conv, cfg=cfg),
            _param(3 * m.d_inner, cfg=cfg),
        )
        self.dt_bias = _param(m.d_inner, cfg=cfg)
        self.A_log = _param(m.n_ssm_heads, cfg=cfg)
        self.hook_decay, self.hook_beta, self.hook_o = HookPoint(), HookPoint(), HookPoint()
        self.w_norm = _param(m.d_ssm_head, cfg=cfg)
        self.W_out, self.b_out = affine_params(m.d_inner, cfg.d_model, cfg)
        self.hook_out = HookPoint()

    def forward(
        self, x: Resid, context: AttentionContext, past: MixerCacheEntry = NO_PAST
    ) -> Resid:
        m = self.settings
        x = self.enter(self.hook_in(x))
        real = real_positions(context, x.shape[1])  # no real token reads padding
        heads = "batch pos (ssm_head d_ssm_head) -> batch pos ssm_head d_ssm_head"
        qkv = torch.cat(
            [affine(x, getattr(self, f"W_{n}"), getattr(self, f"b_{n}")) for n in "qkv"], -1
        )
        qkv = silu(causal_conv_continued(qkv * real, *self.conv_weights(), past))
        q, k, v = (rearrange(t, heads, ssm_head=m.n_ssm_heads) for t in qkv.chunk(3, dim=-1))
        u_f, u_g = self.gate_inputs(x)
        g = self.hook_decay(
            self.decay(rearrange(u_f + self.dt_bias, heads, ssm_head=m.n_ssm_heads))
        )
        # A padding position writes nothing into the state (its beta is 0).
        beta = self.hook_beta(sigmoid(affine(x, self.W_b, self.b_b)) * real)
        q = _unit(q) * m.d_ssm_head**-0.5
        o, last = kimi_delta_scan(q, _unit(k), v, g, beta, past.carried("state"))
        past.carry("state", last)
        o = self.hook_o(o)
        z = rearrange(u_g, heads, ssm_head=m.n_ssm_heads)
        normed = rms_normalized(o, m.ssm_norm_eps)
        gated = normed * self.w_norm * sigmoid(z)
        flat = "batch pos ssm_head d_ssm_head -> batch pos (ssm_head d_ssm_head)"
        return self.hook_out(self.write(rearrange(gated, flat)))

    # The steps a split mixer replaces (`parallel._mixers`), as the gated delta net's.
    def enter(self, x: Resid) -> Resid:
        """The stream the heads read: itself."""
        return x

    def conv_weights(self) -> tuple[Float[Tensor, "channel d_conv"], Float[Tensor, " channel"]]:
        """The convolution's weight and bias over the channels of `q`, `k` and `v`."""
        return self.W_conv, self.b_conv

    def write(self, gated: Inner) -> Resid:
        """The heads' write: `gated @ W_out + b_out`, a sum over the heads' channels."""
        return affine(gated, self.W_out, self.b_out)

    def _low_rank_gates(self, x: Resid) -> tuple[Inner, Inner]:
        """The decay's and the output gate's inputs, each by a low-rank pair of maps."""
        return (
            affine(x, self.W_f_down, self.b_f_down) @ self.W_f_up,
            affine(x, self.W_g_down, self.b_g_down) @ self.W_g_up,
        )

    def _full_rank_gates(self, x: Resid) -> tuple[Inner, Inner]:
        """The decay's and the output gate's inputs, each by one map (Bailing Hybrid)."""
        return affine(x, self.W_f, self.b_f), affine(x, self.W_g, self.b_g)

    def _softplus_decay(self, u: Heads) -> Heads:
        """`g = -exp(A_log) * softplus(u)` (Kimi Linear): any decay in (0, 1]."""
        return -rearrange(self.A_log.exp(), "ssm_head -> ssm_head 1") * softplus(u)

    def _bounded_decay(self, u: Heads) -> Heads:
        """`g = b * sigmoid(exp(A_log) * u)`, `b = kda_decay_bound` (Bailing Hybrid's safe
        gate): a decay in [exp(b), 1]."""
        A = rearrange(self.A_log.exp(), "ssm_head -> ssm_head 1")
        return self.settings.kda_decay_bound * sigmoid(A * u)


def _input_maps(m: MixerConfig) -> tuple[str, ...]:
    """The names of the maps by which the mixer reads the stream (`W_{name}`, `b_{name}`):
    the gates' first low-rank halves, or their whole maps (`kda_full_rank_gates`)."""
    gates = ("f", "g") if m.kda_full_rank_gates else ("f_down", "g_down")
    return ("q", "k", "v", "b", *gates)


def _input_width(m: MixerConfig, name: str) -> int:
    return {"b": m.n_ssm_heads, "f_down": m.dt_rank, "g_down": m.dt_rank}.get(name, m.d_inner)
