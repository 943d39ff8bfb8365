"""Multi-head causal self-attention, in circuits notation.

Each head h reads the residual stream through `W_Q[h], W_K[h], W_V[h]: [d_model d_head]`
and writes back through `W_O[h]: [d_head d_model]` (row vectors: `q = x @ W_Q[h]`). The
seed worklog's `view(batch, seqlen, heads, d_head).transpose(1, 2)` split is the `head`
axis of these weights: concatenating the heads' `z` and multiplying by one
`[n_heads * d_head, d_model]` matrix is the same as summing `z_h @ W_O[h]` over heads,
which is why each head's write can be read on its own (`hook_result`).

    scores  = cap(q k^T / attn_scale), blocked keys -> -inf   (hook_attn_scores; QK circuit)
    pattern = softmax over key positions                      (hook_pattern)
    z       = pattern @ v                                     (hook_z)
    out     = sum_h z_h @ W_O[h] + b_O                        (hook_result per head; OV circuit)

With grouped-query attention (`n_key_value_heads`) the query heads come in groups that
share one key and value head: `hook_k`, `hook_v` are `[batch pos kv_head d_head]`, and
`W_K`, `W_V` show each key/value head once for every query head that reads it, so the QK
and OV circuits stay per query head.

Blocked keys (later positions, padding, outside a local window) are *replaced* by -inf,
never added to, and their values never multiplied in: whatever a blocked position holds
(an `inf` key, a NaN value), it contributes exactly nothing.
"""

import contextlib
import math
from collections.abc import Iterator

import torch
from einops import einsum, rearrange, reduce, repeat
from jaxtyping import Bool, Float
from torch import Tensor, nn

from hookedattn._masks import AttentionContext
from hookedattn.components.embed import _param
from hookedattn.components.norm import NoNorm, RMSNorm
from hookedattn.components.rotary import Rotary
from hookedattn.components.soft_cap import make_soft_cap
from hookedattn.config import HookedTransformerConfig
from hookedattn.hook_points import HookPoint
from hookedattn.kv_cache import KeyValueCacheEntry

# Per-head copies of the input (use_split_qkv_input / use_attn_in, so that each head's
# input can be patched alone), each read by its own head's weights.
_PER_HEAD_IN = "batch pos head d_model, head d_model d_head -> batch pos head d_head"

# The stream itself, or a copy per query head or per key/value head.
AttnInput = Float[Tensor, "batch pos ... d_model"]
HeadVectors = Float[Tensor, "batch pos head d_head"]
KeyVectors = Float[Tensor, "batch pos kv_head d_head"]
Queries = Float[Tensor, "batch query_pos head d_head"]
KeyValues = Float[Tensor, "batch key_pos kv_head d_head"]


class Attention(nn.Module):
    """One attention sublayer: `n_heads` heads reading and writing the residual stream."""

    def __init__(self, cfg: HookedTransformerConfig, layer: int = 0) -> None:
        super().__init__()
        n_heads, d_model, d_head = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q = _param(n_heads, d_model, d_head, cfg=cfg)
        self._init_key_value_weights(cfg)
        self.W_O = _param(n_heads, d_head, d_model, cfg=cfg)
        self.b_Q = _param(n_heads, d_head, cfg=cfg)
        self.b_O = _param(d_model, cfg=cfg)
        self.attn_scale = cfg.attn_scale
        self.group = n_heads // cfg.n_kv_heads  # query heads per key/value head
        self.attn_type = cfg.layer_attn_type(layer)
        per_head_input = cfg.use_split_qkv_input or cfg.use_attn_in
        self.project_qkv = self._project_per_head if per_head_input else self._project_fused
        self._widths = (n_heads * d_head, cfg.n_kv_heads * d_head, cfg.n_kv_heads * d_head)
        self.d_head = d_head
        # The fused weights, kept between forwards only inside `keeping_fused_weights`.
        self._fused: tuple[tuple, Tensor, Tensor] | None = None
        self._keep_fused = False

        self.hook_q = HookPoint()  # [batch pos head d_head]
        self.hook_k = HookPoint()  # [batch pos kv_head d_head]
        self.hook_v = HookPoint()
        self.q_norm, self.k_norm = _qk_norms(cfg)
        if cfg.positional_embedding_type == "rotary":
            self.rotary = Rotary(cfg)
            self.hook_rot_q = HookPoint()
            self.hook_rot_k = HookPoint()
            self.apply_positions = self._rotate
        else:
            self.apply_positions = self._unrotated
        self.soft_cap = make_soft_cap(cfg.attn_scores_soft_cap)
        self._written_out = not cfg.use_fused_kernels or cfg.attn_scores_soft_cap is not None
        self.hook_attn_scores = HookPoint()  # [batch head query_pos key_pos]
        self.hook_pattern = HookPoint()
        self.hook_z = HookPoint()  # [batch pos head d_head]
        if cfg.use_attn_result:
            self.hook_result = HookPoint()  # [batch pos head d_model]
            self.write = self._write_per_head
        else:
            self.write = self._write_summed

    def _init_key_value_weights(self, cfg: HookedTransformerConfig) -> None:
        self.W_K = _param(cfg.n_heads, cfg.d_model, cfg.d_head, cfg=cfg)
        self.W_V = _param(cfg.n_heads, cfg.d_model, cfg.d_head, cfg=cfg)
        self.b_K = _param(cfg.n_heads, cfg.d_head, cfg=cfg)
        self.b_V = _param(cfg.n_heads, cfg.d_head, cfg=cfg)

    def key_value_weights(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """`W_K, b_K, W_V, b_V` as stored: one per key/value head."""
        return self.W_K, self.b_K, self.W_V, self.b_V

    def forward(
        self,
        query_input: AttnInput,
        key_input: AttnInput,
        value_input: AttnInput,
        context: AttentionContext,
        past_kv: KeyValueCacheEntry | None = None,
    ) -> Float[Tensor, "batch query_pos d_model"]:
        q, k, v = self.project_qkv(query_input, key_input, value_input)
        q, k, v = self.q_norm(self.hook_q(q)), self.k_norm(self.hook_k(k)), self.hook_v(v)
        q, k = self.apply_positions(q, k, context)
        if past_kv is not None:
            k, v = past_kv.append(k, v)
        return self.write(self.hook_z(self.mix(q, k, v, context)))

    def mix(self, q: Queries, k: KeyValues, v: KeyValues, context: AttentionContext) -> Queries:
        """`z`, the fused way unless this forward must write the pattern out (the one choice).

        It must where a hook reads or edits the scores or pattern (caching included), and
        where the model asks for it (`use_fused_kernels=False`, a soft cap). A fused kernel
        adds the mask to the scores, and a NaN at a blocked key, or a score that overflows,
        plus -inf is NaN, which would reach every query: a fused `z` that is not finite
        everywhere is therefore computed again written out, where blocked keys contribute
        exactly nothing (and a non-finite value stays at the positions that read it).
        """
        if self._written_out or self.hook_attn_scores._active or self.hook_pattern._active:
            return self.mix_written_out(q, k, v, context)
        z = self.mix_fused(q, k, v, context)
        if context.reads_every_key(self.attn_type):  # no blocked key to leak through
            return z
        if not math.isfinite(z.sum().item()):  # one reduction, one synchronisation
            return self.mix_written_out(q, k, v, context)
        return z

    def mix_written_out(
        self, q: Queries, k: KeyValues, v: KeyValues, context: AttentionContext
    ) -> Queries:
        """`z = softmax(scores) @ v` with the scores and pattern at their hook points."""
        blocked = context.blocked[self.attn_type]
        scores = self.hook_attn_scores(_masked(self.scores(q, k), context, self.attn_type))
        pattern = self.hook_pattern(scores.softmax(dim=-1))
        return _weighted_values(pattern, v, blocked)

    def mix_fused(
        self, q: Queries, k: KeyValues, v: KeyValues, context: AttentionContext
    ) -> Queries:
        """The same `z` by one fused kernel, which never materialises the scores.

        The kernel takes `[batch head pos d_head]`: each operand has its `pos` and `head`
        axes swapped in and out (`transpose(1, 2)`, a view; a plain call rather than
        `rearrange`, whose parsing costs more than the kernel for one generated token).
        """
        allowed, is_causal = context.fused_mask(self.attn_type)
        z = nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2),  # batch pos head d_head -> batch head pos d_head
            k.transpose(1, 2),  # batch pos kv_head d_head -> batch kv_head pos d_head
            v.transpose(1, 2),
            attn_mask=allowed,
            is_causal=is_causal,
            scale=1.0 / self.attn_scale,
            enable_gqa=self.group > 1,
        )
        return z.transpose(1, 2)  # batch head pos d_head -> batch pos head d_head

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

    def _project_fused(
        self, x: Float[Tensor, "batch pos d_model"], key_input: Tensor, value_input: Tensor
    ) -> tuple[HeadVectors, KeyVectors, KeyVectors]:
        """Queries, keys and values of one shared input by one product, split per head.

        `hook_q`, `hook_k`, `hook_v` receive views of that one result, so reading them
        costs nothing extra (and the three share one storage).
        """
        W, b = self.fused_qkv_weights()
        qkv = nn.functional.linear(x, W, b)
        # Three slices (`narrow`), not `split`: autograd lets a hook edit a slice in place,
        # but not one of the several views a single call returns. Each is viewed as
        # batch pos (head d_head) -> batch pos head d_head.
        batch, pos, _ = qkv.shape
        (nq, nkv, _), d_head = self._widths, self.d_head
        return (
            qkv.narrow(-1, 0, nq).view(batch, pos, -1, d_head),
            qkv.narrow(-1, nq, nkv).view(batch, pos, -1, d_head),
            qkv.narrow(-1, nq + nkv, nkv).view(batch, pos, -1, d_head),
        )

    def _project_per_head(
        self, query_input: AttnInput, key_input: AttnInput, value_input: AttnInput
    ) -> tuple[HeadVectors, KeyVectors, KeyVectors]:
        """Queries, keys and values of per-head input copies, each head its own product."""
        W_K, b_K, W_V, b_V = self.key_value_weights()
        return (
            einsum(query_input, self.W_Q, _PER_HEAD_IN) + self.b_Q,
            einsum(key_input, W_K, _PER_HEAD_IN) + b_K,
            einsum(value_input, W_V, _PER_HEAD_IN) + b_V,
        )

    def fused_qkv_weights(
        self,
    ) -> tuple[Float[Tensor, "qkv d_model"], Float[Tensor, " qkv"]]:
        """`W_Q`, `W_K`, `W_V` (and their biases) side by side, laid out for one product.

        Built by each forward (a copy of the weights, small beside the product for many
        tokens). Inside `keeping_fused_weights` (generation, where one token's product is
        as cheap as the copy) the copy is kept while the weights are the same storage,
        unchanged (their version counters) and not being differentiated: an edit of a
        weight, in place or by assignment, is seen by the next step. (An edit through
        `.data`, which bypasses the version counter, is seen at the next `generate`.)
        """
        W_K, b_K, W_V, b_V = self.key_value_weights()
        params = (self.W_Q, W_K, W_V, self.b_Q, b_K, b_V)
        if not self._keep_fused:
            return self._fused_now(params)
        tracked = torch.is_grad_enabled() and any(p.requires_grad for p in params)
        key = tuple((p.data_ptr(), p._version) for p in params)
        kept = self._fused
        if not tracked and kept is not None and kept[0] == key and kept[1].dtype == W_K.dtype:
            return kept[1], kept[2]
        W, b = self._fused_now(params)
        self._fused = None if tracked else (key, W, b)
        return W, b

    @contextlib.contextmanager
    def keeping_fused_weights(self) -> Iterator[None]:
        """Keep the fused q/k/v weights between forwards in this scope, then free them."""
        self._keep_fused = True
        try:
            yield
        finally:
            self._keep_fused, self._fused = False, None

    def _fused_now(self, params: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
        # Query, key and value heads side by side as `[d_model (head d_head)]`, returned
        # transposed (a view) as `F.linear` takes it. Copying whole `d_head` rows this way
        # is 3-12x faster than laying out `[(head d_head) d_model]`, which transposes every
        # head, and the product is as fast from either layout.
        # head d_model d_head -> d_model head d_head (views), then d_model (head d_head).
        W = torch.cat([W.permute(1, 0, 2) for W in params[:3]], dim=1).flatten(1)
        return W.T, torch.cat(params[3:]).flatten()

    def _unrotated(
        self, q: HeadVectors, k: Tensor, context: AttentionContext
    ) -> tuple[Tensor, Tensor]:
        return q, k

    def _rotate(
        self, q: HeadVectors, k: Tensor, context: AttentionContext
    ) -> tuple[Tensor, Tensor]:
        positions = context.positions
        return self.hook_rot_q(self.rotary(q, positions)), self.hook_rot_k(
            self.rotary(k, positions)
        )

    def _write_summed(
        self, z: Float[Tensor, "batch pos head d_head"]
    ) -> Float[Tensor, "batch pos d_model"]:
        # `sum_h z[h] @ W_O[h] + b_O` as one product over (head d_head), the bias inside it.
        W_O = self.W_O.flatten(0, 1)  # head d_head d_model -> (head d_head) d_model, a view
        return nn.functional.linear(z.flatten(-2), W_O.T, self.b_O)

    def _write_per_head(
        self, z: Float[Tensor, "batch pos head d_head"]
    ) -> Float[Tensor, "batch pos d_model"]:
        result = self.hook_result(
            einsum(
                z, self.W_O, "batch pos head d_head, head d_head d_model -> batch pos head d_model"
            )
        )
        return reduce(result, "batch pos head d_model -> batch pos d_model", "sum") + self.b_O


class GroupedQueryAttention(Attention):
    """Attention whose query heads share `n_key_value_heads` key/value heads in groups.

    The stored weights are `_W_K`, `_W_V: [kv_head d_model d_head]` and `_b_K`, `_b_V`
    (TransformerLens's names); `W_K`, `W_V`, `b_K`, `b_V` repeat each for every query head
    of its group, so circuits read them per query head like any other attention.
    """

    def _init_key_value_weights(self, cfg: HookedTransformerConfig) -> None:
        kv = cfg.n_kv_heads
        self._W_K = _param(kv, cfg.d_model, cfg.d_head, cfg=cfg)
        self._W_V = _param(kv, cfg.d_model, cfg.d_head, cfg=cfg)
        self._b_K = _param(kv, cfg.d_head, cfg=cfg)
        self._b_V = _param(kv, cfg.d_head, cfg=cfg)

    def key_value_weights(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """`_W_K, _b_K, _W_V, _b_V` as stored: one per key/value head."""
        return self._W_K, self._b_K, self._W_V, self._b_V

    def _per_query_head(self, weight: Tensor) -> Tensor:
        return repeat(weight, "kv_head ... -> (kv_head group) ...", group=self.group)

    W_K = property(lambda self: self._per_query_head(self._W_K), doc="`[head d_model d_head]`")
    W_V = property(lambda self: self._per_query_head(self._W_V), doc="`[head d_model d_head]`")
    b_K = property(lambda self: self._per_query_head(self._b_K), doc="`[head d_head]`")
    b_V = property(lambda self: self._per_query_head(self._b_V), doc="`[head d_head]`")


def make_attention(cfg: HookedTransformerConfig, layer: int) -> Attention:
    """Attention with one key/value head per query head, or grouped."""
    grouped = cfg.n_key_value_heads is not None  # None when it equals n_heads
    return (GroupedQueryAttention if grouped else Attention)(cfg, layer)


def _qk_norms(cfg: HookedTransformerConfig) -> tuple[nn.Module, nn.Module]:
    """RMSNorms of queries and keys (Qwen 3: per head; OLMo 2: over all heads), or none.

    Always with their gains: a gain on queries does not commute with the rotation that
    follows, so it cannot be folded into `W_Q` the way a residual norm's gain can.
    """
    if not cfg.use_qk_norm:
        return NoNorm(), NoNorm()
    if cfg.qk_norm_per_head:
        return RMSNorm(cfg, (cfg.d_head,)), RMSNorm(cfg, (cfg.d_head,))
    return RMSNorm(cfg, (cfg.n_heads, cfg.d_head)), RMSNorm(cfg, (cfg.n_kv_heads, cfg.d_head))


def _masked(
    scores: Float[Tensor, "batch head query_pos key_pos"], context: AttentionContext, kind: str
) -> Float[Tensor, "batch head query_pos key_pos"]:
    """The scores with every blocked key's replaced by -inf.

    Adding a 0/-inf mask is a quarter of the time of replacing (`masked_fill`), and gives
    the same numbers wherever the scores are finite; a score that is not (an `inf` key, an
    overflow) would make `-inf + inf` NaN, so then the blocked scores are replaced.
    """
    if math.isfinite(scores.sum().item()):  # one reduction, one synchronisation
        return scores + context.additive(kind, scores.dtype)
    return scores.masked_fill(context.blocked[kind], -torch.inf)


def _weighted_values(
    pattern: Float[Tensor, "batch head query_pos key_pos"],
    v: Float[Tensor, "batch key_pos kv_head d_head"],
    blocked: Bool[Tensor, "#batch #head query_pos key_pos"],
) -> Float[Tensor, "batch query_pos head d_head"]:
    """`z = pattern @ v`, each query head reading its group's values.

    A blocked key has weight 0, but `0 * inf` is NaN: where some value is not finite, each
    query's sum runs over the keys it may read only, so that a NaN later in the sequence
    never reaches earlier positions.
    """
    kv_heads = v.shape[2]
    pattern = rearrange(
        pattern,
        "batch (kv_head group) query_pos key_pos -> batch kv_head group query_pos key_pos",
        kv_head=kv_heads,
    )
    if not math.isfinite(v.sum().item()):  # a NaN or inf anywhere (or a sum that overflows)
        return _weighted_values_masked(pattern, v, blocked)
    z = einsum(
        pattern,
        v,
        "batch kv_head group query_pos key_pos, batch key_pos kv_head d_head "
        "-> batch query_pos kv_head group d_head",
    )
    return rearrange(
        z, "batch query_pos kv_head group d_head -> batch query_pos (kv_head group) d_head"
    )


def _weighted_values_masked(
    pattern: Float[Tensor, "batch kv_head group query_pos key_pos"],
    v: Float[Tensor, "batch key_pos kv_head d_head"],
    blocked: Bool[Tensor, "#batch #head query_pos key_pos"],
) -> Float[Tensor, "batch query_pos head d_head"]:
    # The terms pattern * v one by one, blocked ones replaced by exact zeros, then summed.
    blocked = rearrange(
        blocked.expand(pattern.shape[0], -1, -1, -1)[:, :1],
        "batch one query_pos key_pos -> batch one 1 query_pos key_pos 1",
    )
    terms = rearrange(pattern, "batch kv group q k -> batch kv group q k 1") * rearrange(
        v, "batch k kv d_head -> batch kv 1 1 k d_head"
    )
    z = terms.masked_fill(blocked, 0.0).sum(dim=-2)
    return rearrange(
        z, "batch kv_head group query_pos d_head -> batch query_pos (kv_head group) d_head"
    )
