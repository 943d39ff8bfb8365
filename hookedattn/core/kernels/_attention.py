"""How an attention sublayer computes `z`: its equation written out, or one fused kernel.

The equation is `Attention.written_out` (scores, pattern, `z`, through their hook points).
Where nothing reads the scores or the pattern in a forward, one fused kernel
(`scaled_dot_product_attention`) computes the same `z` to the dtype's rounding without
materialising them. Which one runs is decided per forward, from what is known at
construction (`fuses_attention`: `use_fused_kernels`, and no soft cap, which no fused kernel
applies, nor ALiBi's bias, which would be its float mask) and whether a hook is attached to
the scores or pattern (caching included).

torch's fused kernel has no attention sinks (GPT-OSS); they are folded into its call exactly,
as one more key every query reads (`_with_sink_key`), so a sink layer runs fused too, at the
cost of one more key and one more query/key dimension.

Non-finite values are never hidden and never spread: the fused result is kept only when its
inputs and output are all finite (`_guard`: checked once per forward where nothing listens,
otherwise per layer). Otherwise the written-out equation runs, where a NaN or `inf` stays at
the positions that read it.
"""

import math
from typing import Any

import torch
from einops import einsum, rearrange
from jaxtyping import Bool, Float
from torch import Tensor, nn

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.kernels._deferred import defer
from hookedattn.core.kernels._masks import AttentionContext
from hookedattn.core.shapes import HeadOutputs, KeyValues, Queries, Values


def fuses_attention(cfg: HookedTransformerConfig) -> bool:
    """Whether attention built from `cfg` may run as one fused kernel (when unread)."""
    # ALiBi's bias would be the fused kernel's float mask: not written yet, so it runs out.
    return (
        cfg.use_fused_kernels
        and cfg.attn_scores_soft_cap is None
        and cfg.positional_embedding_type != "alibi"
    )


def attend(
    attn: Any, q: Queries, k: KeyValues, v: Values, context: AttentionContext
) -> HeadOutputs:
    """`z` of the attention sublayer `attn`: `attn.written_out(q, k, v, context)`, or the
    same numbers by one fused kernel where `attn.fused`, no hook needs the scores or pattern
    in this forward (one that can wait gets `q`: `_deferred`), and every value is finite."""
    scores, pattern = attn.hook_attn_scores, attn.hook_pattern
    if not attn.fused or scores.needs_value or pattern.needs_value:
        return attn.written_out(q, k, v, context)
    z = fused_attention(q, k, v, context, attn.attn_type, attn.attn_scale, attn.group, attn.sinks)
    if not context.guard.keeps(z, q, k, v):  # checked here, or once for the forward (`_guard`)
        return attn.written_out(q, k, v, context)
    if scores.is_active or pattern.is_active:  # read later, from the queries (`_deferred`)
        defer(attn, (q,), scores, pattern)
    return z


def fused_attention(
    q: Queries,
    k: KeyValues,
    v: Values,
    context: AttentionContext,
    kind: str,
    attn_scale: float,
    group: int,
    sinks: Float[Tensor, " head"] | None = None,
) -> HeadOutputs:
    """`softmax(q k^T / attn_scale, blocked -> -inf) @ v` by one fused kernel; with `sinks`,
    each head's sink logit joins the softmax (`_with_sink_key`).

    The kernel takes `[batch head pos d_head]`: each operand has its `pos` and `head` axes
    swapped in and out (`transpose(1, 2)`, a view; a plain call rather than `rearrange`,
    whose parsing costs more than the kernel for one generated token).
    """
    allowed, is_causal = context.fused_mask(kind)
    if sinks is not None:
        if is_causal:  # the sink key sits after the last key: no causal kernel mask fits
            allowed, is_causal = ~context.blocked[kind], False
        q, k, v, allowed = _with_sink_key(q, k, v, allowed, sinks, attn_scale)
    z = nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2),  # batch pos head d_head -> batch head pos d_head
        k.transpose(1, 2),  # batch pos kv_head d_head -> batch kv_head pos d_head
        v.transpose(1, 2),
        attn_mask=allowed,
        is_causal=is_causal,
        scale=1.0 / attn_scale,
        enable_gqa=group > 1,
    )
    return z.transpose(1, 2)  # batch head pos d_head -> batch pos head d_head


def _with_sink_key(
    q: Queries,
    k: KeyValues,
    v: Values,
    allowed: Bool[Tensor, "#batch 1 query_pos key_pos"] | None,
    sinks: Float[Tensor, " head"],
    attn_scale: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
    """The sinks as one more key that every query reads: exactly the sink softmax.

    Queries gain a last dimension holding `sinks[h] * attn_scale`, real keys a zero there,
    and the sink key is zero except a one there, with a zero value: its score is
    `sinks[h]` for every query of head h (the key is shared by a key/value group, the
    per-head logit rides on the queries), and it adds to the softmax's denominator only.
    """
    batch, n_queries, n_heads, _ = q.shape
    _, n_keys, kv_heads, d_head = k.shape
    logit = (sinks * attn_scale).to(q.dtype)
    q = torch.cat([q, logit.expand(batch, n_queries, n_heads)[..., None]], dim=-1)
    k = torch.cat([k, k.new_zeros(batch, n_keys, kv_heads, 1)], dim=-1)
    sink_key = k.new_zeros(batch, 1, kv_heads, d_head + 1)
    sink_key[..., -1] = 1.0
    k = torch.cat([k, sink_key], dim=1)
    v = torch.cat([v, v.new_zeros(batch, 1, kv_heads, v.shape[-1])], dim=1)
    if allowed is not None:
        allowed = torch.cat([allowed, allowed.new_ones((*allowed.shape[:-1], 1))], dim=-1)
    return q, k, v, allowed


def masked(
    scores: Float[Tensor, "batch head query_pos key_pos"], context: AttentionContext, kind: str
) -> Float[Tensor, "batch head query_pos key_pos"]:
    """The scores with every blocked key's replaced by -inf.

    Adding a 0/-inf mask is cheaper than replacing the blocked scores (`masked_fill`), and gives
    the same numbers wherever the scores are finite; a score that is not (an `inf` key, an
    overflow) would make `-inf + inf` NaN, so then the blocked scores are replaced.
    """
    if math.isfinite(scores.sum().item()):  # one reduction, one synchronisation
        return scores + context.additive(kind, scores.dtype)
    return scores.masked_fill(context.blocked[kind], -torch.inf)


def weighted_values(
    pattern: Float[Tensor, "batch head query_pos key_pos"],
    v: Values,
    blocked: Bool[Tensor, "#batch #head query_pos key_pos"] | None,
) -> HeadOutputs:
    """`z = pattern @ v`, each query head reading its group's values.

    A blocked key has weight 0, but `0 * inf` is NaN: where some value is not finite, each
    query's sum runs over the keys it may read only, so that a NaN later in the sequence
    never reaches earlier positions. `blocked` None: every query reads every key (then a
    value that is not finite reaches every query anyway, and nothing needs checking).
    """
    kv_heads = v.shape[2]
    pattern = rearrange(
        pattern,
        "batch (kv_head group) query_pos key_pos -> batch kv_head group query_pos key_pos",
        kv_head=kv_heads,
    )
    if blocked is not None and not math.isfinite(v.sum().item()):  # a NaN or inf anywhere
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
    v: Values,
    blocked: Bool[Tensor, "#batch #head query_pos key_pos"],
) -> HeadOutputs:
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
