"""The gated delta net (Yang, Kautz and Hatamizadeh 2024, "Gated Delta Networks"), a
sublayer that mixes positions by a delta-rule recurrence in place of attention (Qwen3-Next,
Qwen3.5, OLMo Hybrid).

From the normed stream `x`, per position:

    q, k, v = silu(causal_conv([x @ W_q + b_q; x @ W_k + b_k; x @ W_v + b_v]))
              q, k [key_head d_key], v [head d_head]
    q, k    = q / (|q| sqrt(d_key)), k / |k|           (|u| = sqrt(u . u + 1e-6))
    beta    = beta_scale * sigmoid(x @ W_b + b_b)                       [head]
    g       = -exp(A_log) * softplus(x @ W_a + b_a + dt_bias)           [head], g <= 0
    z       = x @ W_z + b_z                            the output gate    [head d_head]

Each key head serves a run of consecutive value heads (`MixerConfig`: `n_ssm_groups` key
heads of width `d_state`, `n_ssm_heads` value heads of width `d_ssm_head`). Per head, a
state `S` of `d_key x d_head`, decayed by `exp(g_t)` and then corrected towards `v_t` along
`k_t` (the delta rule) with step `beta_t`:

    S_t = exp(g_t) S_{t-1} + beta_t k_t (v_t - exp(g_t) S_{t-1}^T k_t)^T,    o_t = S_t^T q_t

Unrolled, `S_t = sum_{s<=t} D[t, s] k_s u_s^T` with `D[t, s] = exp(sum_{r=s+1..t} g_r)` and
the written values `u_t = beta_t (v_t - sum_{s<t} D[t, s] (k_t . k_s) u_s)`: a unit
lower-triangular system `T U = diag(beta) V` (the UT form of the paper's chunked algorithm,
one chunk the whole sequence). So the output is linear in `v`:

    o = M v,   M = ((Q K^T) * D * causal) T^{-1} diag(beta),
    T = I + strictly_lower(diag(beta) (K K^T) * D)

`M` plays the part of an attention pattern (`hook_mixing`: [batch ssm_head query_pos
key_pos]). Where a hook reads it, this module computes `o` that way (`delta_mixing`);
otherwise, as attention runs fused where its pattern is unread, without forming `M`:
`o = ((Q K^T) * D * causal) U` with `T U = diag(beta) V`, from a starting state where a
cache carries one (`delta_chunk`; one position is one step of the recurrence), in runs of
64 positions each starting from the state the one before left (`delta_rule`: the chunked
algorithm, memory linear in the positions; which one runs: `kernels.mix`). The tests check
both against the recurrence run position by position. Then the gated RMSNorm, over each
head's channels (the norm before the gate, unlike Mamba-2's),

    out = (rmsnorm(o) * w_norm * silu(z)) @ W_out + b_out

In a half-precision model the unit `q` and `k`, the decays, the mixing and `o` are float32
(`hook_mixing` holds float32), as `transformers` computes them. Memory is `[batch ssm_head
pos pos]`, as an eager attention's pattern. With a cache (`kv_cache.MixerCacheEntry`) the
entry carries the state and keeps every position's `k`, `v`, `beta` and `g` (what `M`'s
rows read, should a later step's hook read them); a forward computes its own positions'
reads, and its convolution reads the inputs the cache carried (`causal_conv_continued`).
"""

import torch
from einops import einsum, rearrange, repeat
from jaxtyping import Float
from torch import Tensor, nn
from torch.nn.functional import silu, softplus

from hookedattn.core import kernels
from hookedattn.core.components.causal_conv import causal_conv_continued, real_positions
from hookedattn.core.components.decay import segment_log_decay
from hookedattn.core.components.embed import _param, affine, affine_params
from hookedattn.core.components.norm import rms_normalized
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.kernels import AttentionContext
from hookedattn.core.kv_cache import NO_PAST, MixerCacheEntry
from hookedattn.core.shapes import Resid

Mixing = Float[Tensor, "batch ssm_head query_pos key_pos"]
PerHead = Float[Tensor, "batch pos ssm_head"]
Keys = Float[Tensor, "batch pos group d_state"]
State = Float[Tensor, "batch ssm_head d_state d_ssm_head"]
# The epsilon inside the length of q and k (the published models' kernels fix it).
L2_EPS = 1e-6


def _unit(u: Keys) -> Keys:
    """`u / sqrt(u . u + L2_EPS)` along the last axis."""
    return u * torch.rsqrt(u.pow(2).sum(-1, keepdim=True) + L2_EPS)


def _ut_form(
    q: Float[Tensor, "batch query_pos group d_state"], k: Keys, beta: PerHead, g: PerHead
) -> tuple[
    Float[Tensor, "batch ssm_head key_pos key_pos"],
    Mixing,
    Float[Tensor, "batch ssm_head key_pos key_pos"],
]:
    """`T = I + strictly_lower(diag(beta) (K K^T) * D)` over every position of `k`, the rows
    `(Q K^T) * D * causal` of the positions `q` is given for (the last ones), per value head,
    each reading the `q`, `k` of its key head (module docstring), and `D` itself (0 where
    `s > t`)."""
    per_group = beta.shape[2] // q.shape[2]
    heads = "batch group query_pos key_pos -> batch (group per_group) query_pos key_pos"
    scores = {
        name: repeat(einsum(a, k, "batch query_pos group d_state, batch key_pos group d_state "
                            "-> batch group query_pos key_pos"), heads, per_group=per_group)
        for name, a in (("QK", q), ("KK", k))
    }  # fmt: skip
    n_pos = beta.shape[1]
    decay = segment_log_decay(g).exp()  # 0 above the diagonal
    step = rearrange(beta, "batch pos ssm_head -> batch ssm_head pos 1")  # beta_t by rows
    eye = torch.eye(n_pos, dtype=beta.dtype, device=beta.device)
    T = eye + (step * scores["KK"] * decay).tril(-1)
    return T, scores["QK"] * decay[:, :, n_pos - q.shape[1] :], decay


def delta_mixing(
    q: Float[Tensor, "batch query_pos group d_state"], k: Keys, beta: PerHead, g: PerHead
) -> Mixing:
    """`M = ((Q K^T) * D * causal) T^{-1} diag(beta)` (module docstring), per value head;
    the rows of the positions `q` is given for, the last ones (all, or a cache's new ones:
    `T` is every position's)."""
    T, rows, _ = _ut_form(q, k, beta, g)
    # X T = (Q K^T) * D, solved for X = ((Q K^T) * D) T^{-1}; then the columns times beta.
    X = torch.linalg.solve_triangular(T, rows, upper=False, left=False, unitriangular=True)
    return X * rearrange(beta, "batch key_pos ssm_head -> batch ssm_head 1 key_pos")


def delta_chunk(
    q: Float[Tensor, "batch pos group d_state"],
    k: Keys,
    v: Float[Tensor, "batch pos ssm_head d_ssm_head"],
    beta: PerHead,
    g: PerHead,
    state: State | None = None,
) -> tuple[Float[Tensor, "batch pos ssm_head d_ssm_head"], State]:
    """The reads `o` of a run of positions and the state after its last, from `state`, the
    one the positions before them left (none: zero), by the UT form with a starting state:

        U   = T^{-1} diag(beta) (V - diag(gamma) K S_0)        (the values written)
        o   = diag(gamma) Q S_0 + ((Q K^T) * D * causal) U
        S_n = gamma_n S_0 + sum_j D[n, j] k_j u_j^T

    with `gamma_t = exp(g_1 + ... + g_t)`, the decay since the run began. Without a state
    it is `o = M V` (`delta_mixing`) with `M` never formed: `T U = diag(beta) V` costs
    `pos^2 d_ssm_head` against the `pos^3` of solving for `M`; one position is one step of
    the recurrence."""
    T, rows, decay = _ut_form(q, k, beta, g)
    per_group = beta.shape[2] // q.shape[2]
    heads = "batch pos group d_state -> batch pos (group per_group) d_state"
    q, k = (repeat(t, heads, per_group=per_group) for t in (q, k))
    written = v
    gamma = g.cumsum(1).exp()  # from the run's start: no difference of running totals
    if state is not None:
        read = einsum(
            k, state, "batch pos head d_state, batch head d_state d_v -> batch pos head d_v"
        )
        written = v - gamma[..., None] * read
    rhs = rearrange(beta[..., None] * written, "batch pos head d_v -> batch head pos d_v")
    U = torch.linalg.solve_triangular(T, rhs, upper=False, unitriangular=True)
    o = einsum(
        rows, U, "batch head query_pos key_pos, batch head key_pos d_v -> batch query_pos head d_v"
    )
    last = decay[:, :, -1]  # D[n, j]: the last position's row
    new_state = einsum(last, k, U, "batch head pos, batch pos head d_state, batch head pos d_v "
                       "-> batch head d_state d_v")  # fmt: skip
    if state is not None:
        o = o + gamma[..., None] * einsum(
            q, state, "batch pos head d_state, batch head d_state d_v -> batch pos head d_v"
        )
        new_state = new_state + gamma[:, -1, :, None, None] * state
    return o, new_state


# Positions per run of `delta_chunk` where the mixing matrix is not read: memory and time
# `pos x CHUNK` per head rather than `pos x pos` (the chunked algorithm's usual size).
CHUNK = 64


def delta_rule(
    q: Float[Tensor, "batch pos group d_state"],
    k: Keys,
    v: Float[Tensor, "batch pos ssm_head d_ssm_head"],
    beta: PerHead,
    g: PerHead,
    state: State | None = None,
    chunk: int = CHUNK,
) -> tuple[Float[Tensor, "batch pos ssm_head d_ssm_head"], State]:
    """`delta_chunk` over runs of `chunk` positions, each from the state the one before it
    left: the same reads and state to rounding, in memory linear in the positions."""
    return kernels.in_runs(delta_chunk, (q, k, v, beta, g), state, chunk)


class GatedDeltaNet(nn.Module):
    """The gated delta net (module docstring). Hook points: `hook_in` (the normed stream it
    reads), `hook_beta` (each step `beta`), `hook_decay` (each `g`, the log of the decay),
    `hook_q`, `hook_k` (the unit queries and keys, per key head; the rule reads the queries
    scaled by `d_state^-1/2`), `hook_v` (per value head), `hook_mixing` (`M`), `hook_o` (the
    heads' reads, `o = M v`), `hook_out` (what it writes, before any post-norm)."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        m = self.settings = cfg.mixers
        self.d_key = m.n_ssm_groups * m.d_state
        d_qkv = 2 * self.d_key + m.d_inner
        self.hook_in = HookPoint()
        # The inputs: q, k, v, the output gate z, beta's and the decay's pre-activations.
        widths = dict(q=self.d_key, k=self.d_key, v=m.d_inner, z=m.d_inner,
                      b=m.n_ssm_heads, a=m.n_ssm_heads)  # fmt: skip
        for name, width in widths.items():
            W, b = affine_params(cfg.d_model, width, cfg)
            setattr(self, f"W_{name}", W)
            setattr(self, f"b_{name}", b)
        self.W_conv, self.b_conv = _param(d_qkv, m.d_conv, cfg=cfg), _param(d_qkv, cfg=cfg)
        self.dt_bias = _param(m.n_ssm_heads, cfg=cfg)
        self.A_log = _param(m.n_ssm_heads, cfg=cfg)
        self.hook_beta, self.hook_decay = HookPoint(), HookPoint()  # [batch pos ssm_head]
        self.hook_q, self.hook_k = HookPoint(), HookPoint()  # [batch pos group d_state]
        self.hook_v = HookPoint()  # [batch pos ssm_head d_ssm_head]
        self.hook_mixing = HookPoint()
        self.fused = cfg.use_fused_kernels  # the rule from its state where M is unread
        self.hook_o = HookPoint()  # [batch pos ssm_head d_ssm_head]
        self.w_norm = _param(m.d_ssm_head, cfg=cfg)
        self.W_out, self.b_out = affine_params(m.d_inner, cfg.d_model, cfg)
        self.hook_out = HookPoint()

    def forward(
        self, x: Resid, context: AttentionContext, past: MixerCacheEntry = NO_PAST
    ) -> Resid:
        m = self.settings
        x = self.enter(self.hook_in(x))
        real = real_positions(context, x.shape[1])  # no real token reads padding
        qkv = torch.cat([affine(x, self.W_q, self.b_q), affine(x, self.W_k, self.b_k),
                         affine(x, self.W_v, self.b_v)], dim=-1)  # fmt: skip
        qkv = silu(causal_conv_continued(qkv * real, *self.conv_weights(), past))
        q, k, v = qkv.split([self.d_key, self.d_key, m.d_inner], dim=-1)
        q, k = (rearrange(t, "batch pos (group d_state) -> batch pos group d_state",
                          group=m.n_ssm_groups) for t in (q, k))  # fmt: skip
        heads = "batch pos (ssm_head d_ssm_head) -> batch pos ssm_head d_ssm_head"
        v = rearrange(v, heads, ssm_head=m.n_ssm_heads)
        z = rearrange(affine(x, self.W_z, self.b_z), heads, ssm_head=m.n_ssm_heads)
        # The rule runs in float32 at least, as transformers runs it: a bfloat16 model's
        # unit q and k, decays and mixing in float32 (torch has no half-precision
        # triangular solve).
        work = torch.promote_types(x.dtype, torch.float32)
        # A padding position writes nothing into the state (its beta is 0).
        beta = self.hook_beta(
            m.delta_beta_scale * torch.sigmoid(affine(x, self.W_b, self.b_b)) * real
        )
        rate = affine(x, self.W_a, self.b_a).to(work) + self.dt_bias.to(work)
        g = self.hook_decay(-self.A_log.to(work).exp() * softplus(rate))
        q, k = self.hook_q(_unit(q.to(work))), self.hook_k(_unit(k.to(work)))
        o = self._delta_rule(q * m.d_state**-0.5, k, self.hook_v(v), beta, g, past)
        o = self.hook_o(o.to(x.dtype))
        normed = rms_normalized(o, m.ssm_norm_eps)
        gated = normed * self.w_norm * silu(z)
        flat = "batch pos ssm_head d_ssm_head -> batch pos (ssm_head d_ssm_head)"
        return self.hook_out(self.write(rearrange(gated, flat)))

    # The steps a split of the heads over processes replaces (`hookedattn.core.parallel`).
    def enter(self, x: Resid) -> Resid:
        """The stream the heads read: itself."""
        return x

    def conv_weights(
        self,
    ) -> tuple[Float[Tensor, "channel d_conv"], Float[Tensor, " channel"]]:
        """The convolution's weight and bias over the channels of `q`, `k` and `v`."""
        return self.W_conv, self.b_conv

    def write(self, gated: Float[Tensor, "batch pos d_inner"]) -> Resid:
        """The heads' write: `gated @ W_out + b_out`, a sum over the heads' channels."""
        return affine(gated, self.W_out, self.b_out)

    def _delta_rule(
        self,
        q: Float[Tensor, "batch pos group d_state"],
        k: Keys,
        v: Float[Tensor, "batch pos ssm_head d_ssm_head"],
        beta: PerHead,
        g: PerHead,
        past: MixerCacheEntry,
    ) -> Float[Tensor, "batch pos ssm_head d_ssm_head"]:
        """The new positions' reads `o` (`kernels.mix`): by `delta_rule` from the state the
        cache carried, or, where a hook reads the mixing matrix, `o = M v` written out over
        every position, from the cache's `k`, `v`, `beta` and `g` and these."""
        work = q.dtype
        every = past.rows("k", k), past.rows("v", v), past.rows("beta", beta), past.rows("g", g)

        def written_out() -> Float[Tensor, "batch pos ssm_head d_ssm_head"]:
            k_all, v_all, beta_all, g_all = every
            mixing = self.hook_mixing(delta_mixing(q, k_all, beta_all.to(work), g_all))
            return einsum(mixing, v_all.to(work), "batch ssm_head query_pos key_pos, batch "
                          "key_pos ssm_head d_ssm_head "
                          "-> batch query_pos ssm_head d_ssm_head")  # fmt: skip

        by_state = lambda state: delta_rule(q, k, v.to(work), beta.to(work), g, state)
        return kernels.mix(self.hook_mixing, self.fused, past, by_state, written_out)
