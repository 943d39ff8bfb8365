"""Multi-head causal self-attention, in circuits notation.

Each head h reads the residual stream through `W_Q[h], W_K[h], W_V[h]: [d_model d_head]`
and writes back through `W_O[h]: [d_head d_model]` (row vectors: `q = x @ W_Q[h]`). The
usual `view(batch, seqlen, heads, d_head).transpose(1, 2)` split of one big projection is
the `head` axis of these weights: concatenating the heads' `z` and multiplying by one
`[n_heads * d_head, d_model]` matrix is the same as summing `z_h @ W_O[h]` over heads,
which is why each head's write can be read on its own (`hook_result`).

    q, k, v = x @ W_Q + b_Q, x @ W_K + b_K, x @ W_V + b_V      (hook_q, hook_k, hook_v)
    q, k    = rotary(q_norm(q)), rotary(k_norm(k))            (hook_rot_q, hook_rot_k;
              [q_norm(rotary(q)), ... with `qk_norm_after_rotary`]    each step optional)
    v       = v_norm(v)                                       (`use_v_norm`: Gemma 4's,
                                                               weightless, per head)
              [a block without rotation may scale its queries by position instead:
               q = tau(position) * q (hook_q_tuned), `components.query_temperature`]
    scores  = cap(q k^T / attn_scale), blocked keys -> -inf   (hook_attn_scores; QK circuit)
              [ALiBi: + slope_h (key_pos - query_pos) before the mask: `components.alibi`]
    pattern = softmax over key positions                      (hook_pattern)
              [with sinks: softmax over the keys and one sink logit s_h, the sink's share
               dropped, so a row sums to 1 - its sink's share]
    z       = pattern @ v                                     (hook_z)
              [gated: z_h * gate(x @ W_G[h] + b_G[h]), the gate (hook_attn_gate) one
               factor per dimension of the head or one per head (Qwen3-Next, Laguna)]
    out     = sum_h z_h @ W_O[h] + b_O                        (hook_result per head; OV circuit)

An attention sink (`use_attn_sinks`, GPT-OSS; Xiao et al. 2023's sink token as a learned
logit) is a key every query may read, whose value is zero: attending to it writes nothing,
so a head can decline to move information without picking a real key.

With grouped-query attention (`n_key_value_heads`) the query heads come in groups that
share one key and value head: `hook_k`, `hook_v` are `[batch pos kv_head d_head]`, and
`W_K`, `W_V` show each key/value head once for every query head that reads it, so the QK
and OV circuits stay per query head.

`written_out` is the schematic step by step; `pattern` its step from the queries and keys
as the scores read them (`scored`) to the pattern, for the rows of any queries (a context
from `kernels.rows_context`), so that patterns can be made again from kept queries and
keys a block of rows at a time. How a forward runs it (`kernels.attend`: one
fused kernel where nothing reads the scores or pattern, the guards that keep non-finite
values from hiding or spreading, the fused q/k/v product) lives in `hookedattn.core.kernels`.
"""

from typing import Any

import torch
from einops import einsum, rearrange, reduce, repeat
from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.core import kernels
from hookedattn.core.components.alibi import ALiBi
from hookedattn.core.components.attention_gate import make_gate
from hookedattn.core.components.embed import _param, affine
from hookedattn.core.components.norm import LayerNorm, NoNorm, RMSNorm, RMSNormPre, make_norm
from hookedattn.core.components.query_temperature import QueryTemperature
from hookedattn.core.components.rotary import Rotary
from hookedattn.core.components.soft_cap import make_soft_cap
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.kernels import AttentionContext
from hookedattn.core.kv_cache import KeyValueCacheEntry
from hookedattn.core.shapes import (
    HeadOutputs,
    HeadVectors,
    KeyValues,
    KeyVectors,
    Queries,
    Values,
    ValueVectors,
)

# Per-head copies of the input (use_split_qkv_input / use_attn_in, so that each head's
# input can be patched alone), each read by its own head's weights.
_PER_HEAD_IN = "batch pos head d_model, head d_model d_head -> batch pos head d_head"

# Separate query, key and value inputs, each shared by the heads (a shortformer's: the
# queries' and keys' inputs carry the positions, the values' does not).
_SHARED_IN = "batch pos d_model, head d_model d_head -> batch pos head d_head"

# The stream itself, or a copy per query head or per key/value head.
AttnInput = Float[Tensor, "batch pos ... d_model"]


class Attention(nn.Module):
    """One attention sublayer: `n_heads` heads reading and writing the residual stream."""

    def __init__(self, cfg: HookedTransformerConfig, layer: int = 0) -> None:
        super().__init__()
        n_heads, d_model, d_head = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q = _param(n_heads, d_model, d_head, cfg=cfg)
        self._init_key_value_weights(cfg)
        self.W_O = _param(n_heads, cfg.d_value, d_model, cfg=cfg)
        self.b_Q = _param(n_heads, d_head, cfg=cfg)
        self.b_O = _param(d_model, cfg=cfg)
        self._init_scoring(cfg, layer)
        per_head_input = cfg.use_split_qkv_input or cfg.use_attn_in
        # How each head's product reads its input (`project_queries`, `_project_each`).
        self.input_pattern = _PER_HEAD_IN if per_head_input else _SHARED_IN
        self.project_qkv = self._project_shared
        if per_head_input or cfg.positional_embedding_type == "shortformer":
            self.project_qkv = self._project_each
        self.fused_qkv = kernels.FusedQKV(cfg)
        self._tie_fused_weights()

        self.hook_q = HookPoint()  # [batch pos head d_head]
        self.hook_k = HookPoint()  # [batch pos kv_head d_head]
        self.hook_v = HookPoint()
        self.q_norm, self.k_norm = _qk_norms(cfg, layer)
        # Gemma 4: each value head RMS-normed, without a gain, before the heads read it.
        self.v_norm = RMSNormPre(cfg, (cfg.d_value,)) if cfg.use_v_norm else NoNorm()
        # How the positions enter the queries and keys (`position_queries` alone: the
        # queries of a block that reads another block's keys, `shared_kv_attention`).
        if cfg.layer_rotates(layer):
            self.rotary = Rotary(cfg, local=self.attn_type == "local")
            self.hook_rot_q = HookPoint()
            self.hook_rot_k = HookPoint()
            self.apply_positions, self.position_queries = self._rotate, self._rotated_queries
        elif cfg.layer_tunes_queries(layer):
            self.query_temperature = QueryTemperature(cfg)
            self.hook_q_tuned = HookPoint()  # [batch pos head d_head]
            self.apply_positions, self.position_queries = self._tuned, self._tuned_queries
        else:
            self.apply_positions, self.position_queries = self._unrotated, _same_queries
        if cfg.positional_embedding_type == "alibi":
            self.alibi = ALiBi(cfg)
            self.biased = self._alibi_biased
        # The q/k norms before the rotation, or after it (`qk_norm_after_rotary`, HunYuan):
        # the norms' own calls (bound, so they stay registered once, as `q_norm`, `k_norm`).
        norms, unnormed = (self.q_norm.__call__, self.k_norm.__call__), (_same, _same)
        after = cfg.qk_norm_after_rotary
        self.q_before, self.k_before = unnormed if after else norms
        self.q_after, self.k_after = norms if after else unnormed
        self._init_pattern_and_write(cfg)

    def _init_scoring(self, cfg: HookedTransformerConfig, layer: int) -> None:
        """How scores become a pattern: the scale, the keys a query may read, the softmax
        (with sinks or not), and whether a fused kernel may run it."""
        self.attn_scale = cfg.attn_scale
        self.group = cfg.n_heads // cfg.n_kv_heads  # query heads per key/value head
        self.attn_type = cfg.layer_attn_type(layer)
        # One logit per head, the sink's score in every query's softmax; None without sinks.
        self.register_parameter(
            "sinks", _param(cfg.n_heads, cfg=cfg) if cfg.use_attn_sinks else None
        )
        self.normalize_scores = self._softmax_with_sinks if cfg.use_attn_sinks else self._softmax
        self.fused = kernels.fuses_attention(cfg)
        # Gemma 4's shared keys: a block that later blocks read (`n_kv_shared_layers`)
        # leaves its keys and values in the context for them.
        self.share = self._shared if cfg.layer_stores_kv(layer) else _unshared

    def _init_pattern_and_write(self, cfg: HookedTransformerConfig) -> None:
        """The hook points from the scores on, and how the heads' `z` are written back."""
        self.soft_cap = make_soft_cap(cfg.attn_scores_soft_cap)
        self.hook_attn_scores = HookPoint()  # [batch head query_pos key_pos]
        self.hook_pattern = HookPoint()
        self.gated = self._ungated
        if cfg.attn_gate is not None:
            d_gate = 1 if cfg.attn_gate_per_head else cfg.d_value  # one factor per z entry
            self.W_G = _param(cfg.n_heads, cfg.d_model, d_gate, cfg=cfg)
            self.b_G = _param(cfg.n_heads, d_gate, cfg=cfg)
            self.gate_fn = make_gate(cfg)  # `components.attention_gate`
            self.gate_pattern = (_PER_HEAD_IN if cfg.use_split_qkv_input or cfg.use_attn_in
                                 else _SHARED_IN)  # fmt: skip
            self.hook_attn_gate = HookPoint()  # [batch pos head d_gate]
            self.gated = self._gated
        self.hook_z = HookPoint()  # [batch pos head d_head_v]
        if cfg.use_attn_result:
            self.hook_result = HookPoint()  # [batch pos head d_model]
            self.write = self._write_per_head
        else:
            self.write = self._write_summed
        if cfg.attn_sub_norm:  # BitNet: W_O reads the heads' z normed together
            self.sub_norm = make_norm(cfg, (cfg.n_heads, cfg.d_value))
            self.hook_z_normed = HookPoint()  # [batch pos head d_head]
            self.write_heads, self.write = self.write, self._write_normed

    def _write_normed(self, z: HeadOutputs) -> Float[Tensor, "batch pos d_model"]:
        """`sum_h zn_h @ W_O[h] + b_O` with `zn = sub_norm(z)`, one norm over every head's
        dimensions (one scale per position, shared by the heads): each head's write is
        still its own `zn_h @ W_O[h]`, so the per-head terms sum to the output."""
        return self.write_heads(self.hook_z_normed(self.sub_norm(z)))

    def _init_key_value_weights(self, cfg: HookedTransformerConfig) -> None:
        self.W_K = _param(cfg.n_heads, cfg.d_model, cfg.d_head, cfg=cfg)
        self.W_V = _param(cfg.n_heads, cfg.d_model, cfg.d_value, cfg=cfg)
        self.b_K = _param(cfg.n_heads, cfg.d_head, cfg=cfg)
        self.b_V = _param(cfg.n_heads, cfg.d_value, cfg=cfg)

    def key_value_weights(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """`W_K, b_K, W_V, b_V` as stored: one per key/value head."""
        return self.W_K, self.b_K, self.W_V, self.b_V

    def _tie_fused_weights(self) -> None:
        """Make the q/k/v parameters views of the fused product's one weight
        (`kernels.FusedQKV.tie`), where they are parameters of their own (latent attention
        has no fused product; the TransformerLens facade's ungrouped keys are repeats)."""
        fused = self.__dict__.get("fused_qkv")
        if fused is None:
            return
        params = (self.W_Q, self.b_Q, *self.key_value_weights())
        if all(isinstance(p, nn.Parameter) for p in params):
            fused.tie(params)

    def _apply(self, fn: Any, recurse: bool = True) -> "Attention":
        # `.to()`, `.double()`, ... give each parameter storage of its own: tie them again.
        super()._apply(fn, recurse)
        self._tie_fused_weights()
        return self

    def forward(
        self,
        query_input: AttnInput,
        key_input: AttnInput,
        value_input: AttnInput,
        context: AttentionContext,
        past_kv: KeyValueCacheEntry | None = None,
    ) -> Float[Tensor, "batch query_pos d_model"]:
        q, k, v = self.project_qkv(query_input, key_input, value_input)
        q, k = self.q_before(self.hook_q(q)), self.k_before(self.hook_k(k))
        v = self.v_norm(self.hook_v(v))
        q, k = self._positioned(q, k, context)
        if past_kv is not None:
            k, v = past_kv.append(k, v)
        self.share(k, v, context)
        # `written_out`, or one fused kernel, of the values as the heads read them
        z = kernels.attend(self, q, k, self.read_values(v), context)
        return self.write(self.hook_z(self.gated(z, query_input)))

    def scored(
        self, q: HeadVectors, k: KeyVectors, context: AttentionContext
    ) -> tuple[Queries, KeyValues]:
        """The queries and keys the scores read, from the values at `hook_q` and `hook_k`
        (q/k norms and rotation, in this layer's order): what `pattern` takes."""
        return self._positioned(self.q_before(q), self.k_before(k), context)

    def _positioned(
        self, q: HeadVectors, k: KeyVectors, context: AttentionContext
    ) -> tuple[Queries, KeyValues]:
        q, k = self.apply_positions(q, k, context)
        return self.q_after(q), self.k_after(k)

    def _shared(self, k: KeyValues, v: Values, context: AttentionContext) -> None:
        """Leave the keys and values the heads read (a KV cache's positions first) in the
        context, for the later blocks of this attention type that read them
        (`components.shared_kv_attention`)."""
        context.shared_kv[self.attn_type] = k, v

    def _ungated(self, z: HeadOutputs, query_input: AttnInput) -> HeadOutputs:
        return z

    def read_values(self, v: Values) -> Values:
        """The values as the heads read them: those at `hook_v` (differential attention
        pairs them: `components.differential_attention`)."""
        return v

    def _gated(self, z: HeadOutputs, query_input: AttnInput) -> HeadOutputs:
        """`z * gate(x @ W_G + b_G)` per head (per dimension, or one factor per head)."""
        pre = einsum(query_input, self.W_G, self.gate_pattern) + self.b_G
        return z * self.hook_attn_gate(self.gate_fn(pre)).to(z.dtype)

    def written_out(
        self, q: Queries, k: KeyValues, v: Values, context: AttentionContext
    ) -> HeadOutputs:
        """`z = softmax(scores) @ v` step by step, the scores and pattern at their hook points.

        Blocked keys (later positions, padding, outside a local window) are replaced by
        -inf, never added to, and their values never multiplied in: whatever a blocked
        position holds (an `inf` key, a NaN value), it contributes exactly nothing. Where
        no key is blocked (one unpadded query after a KV cache) there is nothing to mask.
        """
        pattern = self.pattern(q, k, context)
        every_key = context.reads_every_key(self.attn_type)  # a generation step: none blocked
        blocked = None if every_key else context.blocked[self.attn_type]
        return kernels.weighted_values(pattern, v, blocked)

    def _unbiased(
        self, scores: Float[Tensor, "batch head query_pos key_pos"], context: AttentionContext
    ) -> Float[Tensor, "batch head query_pos key_pos"]:
        return scores

    # The scores' position bias: none, or ALiBi's (`_alibi_biased`, set at construction).
    biased = _unbiased

    def _alibi_biased(
        self, scores: Float[Tensor, "batch head query_pos key_pos"], context: AttentionContext
    ) -> Float[Tensor, "batch head query_pos key_pos"]:
        """The scores plus each head's ALiBi distance penalty (`components.alibi`)."""
        return self.alibi(scores, context.positions, context.key_positions(scores.shape[-1]))

    def pattern(
        self, q: Queries, k: KeyValues, context: AttentionContext
    ) -> Float[Tensor, "batch head query_pos key_pos"]:
        """The pattern of the queries `q` over the keys `k`: the softmax of the scores, each
        blocked key's -inf (`context`: the rows of any queries, `kernels.rows_context`),
        through `hook_attn_scores` and `hook_pattern`."""
        scores = self.biased(self.scores(q, k), context)
        if not context.reads_every_key(self.attn_type):
            scores = kernels.masked(scores, context, self.attn_type)
        return self.hook_pattern(self.normalize_scores(self.hook_attn_scores(scores)))

    def _softmax(
        self, scores: Float[Tensor, "batch head query_pos key_pos"]
    ) -> Float[Tensor, "batch head query_pos key_pos"]:
        return scores.softmax(dim=-1)

    def _softmax_with_sinks(
        self, scores: Float[Tensor, "batch head query_pos key_pos"]
    ) -> Float[Tensor, "batch head query_pos key_pos"]:
        """The softmax over the keys and each head's sink logit, the sink's share dropped."""
        batch, _, n_queries, _ = scores.shape
        sink = repeat(self.sinks.to(scores.dtype), "head -> batch head query_pos 1",
                      batch=batch, query_pos=n_queries)  # fmt: skip
        return torch.cat([scores, sink], dim=-1).softmax(dim=-1)[..., :-1]

    def scores(self, q: Queries, k: KeyValues) -> Float[Tensor, "batch head query_pos key_pos"]:
        """`cap(q . k / attn_scale)` for every query head and key position."""
        q = rearrange(
            q / self.attn_scale,  # scaling q is a pass over d_head, not over every key
            "batch query_pos (kv_head group) d_head -> batch query_pos kv_head group d_head",
            group=self.group,
        )
        scores = einsum(
            q,
            k,
            "batch query_pos kv_head group d_head, batch key_pos kv_head d_head "
            "-> batch kv_head group query_pos key_pos",
        )
        scores = rearrange(
            scores,
            "batch kv_head group query_pos key_pos -> batch (kv_head group) query_pos key_pos",
        )
        return self.soft_cap(scores)

    def _project_shared(
        self, x: Float[Tensor, "batch pos d_model"], key_input: Tensor, value_input: Tensor
    ) -> tuple[HeadVectors, KeyVectors, ValueVectors]:
        """Queries, keys and values of one shared input, by one product (`kernels.FusedQKV`)."""
        return self.fused_qkv.project(x, self.W_Q, self.b_Q, *self.key_value_weights())

    def _project_each(
        self, query_input: AttnInput, key_input: AttnInput, value_input: AttnInput
    ) -> tuple[HeadVectors, KeyVectors, ValueVectors]:
        """Queries, keys and values of their own inputs, a product each: per-head copies of
        the stream, or (shortformer) query and key inputs that carry the positions."""
        W_K, b_K, W_V, b_V = self.key_value_weights()
        return (
            self.project_queries(query_input),
            einsum(key_input, W_K, self.input_pattern) + b_K,
            einsum(value_input, W_V, self.input_pattern) + b_V,
        )

    def project_queries(self, query_input: AttnInput) -> HeadVectors:
        """`x @ W_Q + b_Q` for every head, a product of its own (the fused product computes
        the same numbers with the keys and values: `_project_shared`)."""
        return einsum(query_input, self.W_Q, self.input_pattern) + self.b_Q

    def _unrotated(
        self, q: HeadVectors, k: Tensor, context: AttentionContext
    ) -> tuple[Tensor, Tensor]:
        return q, k

    def _rotate(
        self, q: HeadVectors, k: Tensor, context: AttentionContext
    ) -> tuple[Tensor, Tensor]:
        rotated_q = self._rotated_queries(q, context)  # hook_rot_q first, then hook_rot_k
        return rotated_q, self.hook_rot_k(self.rotary(k, context.positions))

    def _rotated_queries(self, q: HeadVectors, context: AttentionContext) -> Queries:
        return self.hook_rot_q(self.rotary(q, context.positions))

    def _tuned(self, q: HeadVectors, k: Tensor, context: AttentionContext) -> tuple[Tensor, Tensor]:
        """The queries scaled by their positions' temperature; the keys as they are."""
        return self._tuned_queries(q, context), k

    def _tuned_queries(self, q: HeadVectors, context: AttentionContext) -> Queries:
        return self.hook_q_tuned(self.query_temperature(q, context.positions))

    def _write_summed(
        self, z: Float[Tensor, "batch pos head d_head"]
    ) -> Float[Tensor, "batch pos d_model"]:
        # `sum_h z[h] @ W_O[h] + b_O` as one product over (head d_head), the bias inside it.
        # head d_head d_model -> (head d_head) d_model, a view (kept: `kernels.kept_view`)
        W_O = kernels.kept_view(self.W_O, "_hookedattn_flat", _heads_flattened)
        return self.summed(z.flatten(-2), W_O, self.b_O)

    def _write_per_head(
        self, z: Float[Tensor, "batch pos head d_head"]
    ) -> Float[Tensor, "batch pos d_model"]:
        result = self.hook_result(
            einsum(
                z, self.W_O, "batch pos head d_head, head d_head d_model -> batch pos head d_model"
            )
        )
        return self.summed_heads(result) + self.b_O

    # How the heads' writes add up: the steps a split of the heads over processes replaces
    # (`hookedattn.core.parallel`: each process's heads, then a sum over processes).
    def summed(
        self, z: Float[Tensor, "batch pos hd"], W_O: Float[Tensor, "hd d_model"], b_O: Tensor
    ) -> Float[Tensor, "batch pos d_model"]:
        """`z @ W_O + b_O` over every head's `(head d_head)` dimensions."""
        return affine(z, W_O, b_O)

    def summed_heads(
        self, result: Float[Tensor, "batch pos head d_model"]
    ) -> Float[Tensor, "batch pos d_model"]:
        """The sum of every head's result."""
        return reduce(result, "batch pos head d_model -> batch pos d_model", "sum")


class GroupedQueryAttention(Attention):
    """Attention whose query heads share `n_key_value_heads` key/value heads in groups.

    The stored weights are `_W_K`, `_W_V: [kv_head d_model d_head]` and `_b_K`, `_b_V`
    (TransformerLens's names); `W_K`, `W_V`, `b_K`, `b_V` repeat each for every query head
    of its group, so circuits read them per query head like any other attention.
    """

    def _init_key_value_weights(self, cfg: HookedTransformerConfig) -> None:
        kv = cfg.n_kv_heads
        self._W_K = _param(kv, cfg.d_model, cfg.d_head, cfg=cfg)
        self._W_V = _param(kv, cfg.d_model, cfg.d_value, cfg=cfg)
        self._b_K = _param(kv, cfg.d_head, cfg=cfg)
        self._b_V = _param(kv, cfg.d_value, cfg=cfg)

    def key_value_weights(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """`_W_K, _b_K, _W_V, _b_V` as stored: one per key/value head."""
        return self._W_K, self._b_K, self._W_V, self._b_V

    def _per_query_head(self, weight: Tensor) -> Tensor:
        return repeat(weight, "kv_head ... -> (kv_head group) ...", group=self.group)

    W_K = property(lambda self: self._per_query_head(self._W_K), doc="`[head d_model d_head]`")
    W_V = property(lambda self: self._per_query_head(self._W_V), doc="`[head d_model d_head]`")
    b_K = property(lambda self: self._per_query_head(self._b_K), doc="`[head d_head]`")
    b_V = property(lambda self: self._per_query_head(self._b_V), doc="`[head d_head]`")


def _same(x: Tensor) -> Tensor:
    return x


def _same_queries(q: HeadVectors, context: AttentionContext) -> Queries:
    """The queries as they are: positions enter neither them nor the keys."""
    return q


def _unshared(k: KeyValues, v: Values, context: AttentionContext) -> None:
    """Nothing: no later block reads this block's keys and values."""


def _heads_flattened(W_O: Tensor) -> Tensor:
    return W_O.flatten(0, 1)


def _qk_norms(cfg: HookedTransformerConfig, layer: int) -> tuple[nn.Module, nn.Module]:
    """RMSNorms of queries and keys (Qwen 3: per head; OLMo 2: over all heads), LayerNorms
    with `qk_norm_type="LN"` (Persimmon), or none (in block `layer`: `layer_norms_qk`).

    Always with their gains: a gain on queries does not commute with the rotation that
    follows, so it cannot be folded into `W_Q` the way a residual norm's gain can.
    """
    if not cfg.layer_norms_qk(layer):
        return NoNorm(), NoNorm()
    norm = LayerNorm if cfg.qk_norm_type == "LN" else RMSNorm
    if cfg.qk_norm_per_head:
        return norm(cfg, (cfg.d_head,)), norm(cfg, (cfg.d_head,))
    return norm(cfg, (cfg.n_heads, cfg.d_head)), norm(cfg, (cfg.n_kv_heads, cfg.d_head))
