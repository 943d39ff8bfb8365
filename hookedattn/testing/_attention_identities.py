"""The identities inside attention: scores, softmax, causality, windows, values, heads.

With grouped-query attention the keys and values are cached one per key/value head, and
query head `h` reads key/value head `h // group`.
"""

import torch
from einops import einsum, rearrange
from torch import Tensor, nn

from hookedattn.core import names as _names
from hookedattn.testing._identity import (
    PRODUCTS,
    TERMS,
    VALUE,
    Get,
    Identity,
    NormAtScale,
    Sides,
    same_keys,
    weight,
)


def _grouped(heads: Tensor, group: int, pattern: str) -> Tensor:
    """Split a query-head axis into `kv_head group`: query head `h` reads key/value head
    `h // group`."""
    return rearrange(heads, pattern, group=group)


_QK = (
    "... query_pos kv_head group d_head, ... key_pos kv_head d_head "
    "-> ... kv_head group query_pos key_pos"
)


def scores(
    scores: str,
    q: str,
    k: str,
    attn_scale: float,
    group: int,
    cap: float | None,
    slopes: Tensor | None = None,
) -> Identity:
    """`scores == cap(q . k / attn_scale)` on the unmasked entries, each query head
    against its group's key head; with ALiBi `slopes`, plus `slope[h] * (k - q)` (the
    positions of one unpadded sequence: the last queries of its keys)."""

    def sides(get: Get) -> Sides:
        q_, k_, s = get(q), get(k), get(scores)
        same_keys(k, k_.shape[-3], s.shape[-1])
        q_ = _grouped(q_, group, "... p (kv_head group) d -> ... p kv_head group d")
        ungroup = "... kv_head group q k -> ... (kv_head group) q k"
        raw = rearrange(einsum(q_, k_, _QK), ungroup) / attn_scale
        size = rearrange(einsum(q_.abs(), k_.abs(), _QK), ungroup) / attn_scale
        if slopes is not None:
            n_queries, n_keys = raw.shape[-2:]
            keys = torch.arange(n_keys, dtype=raw.dtype, device=raw.device)
            distance = keys - (keys[n_keys - n_queries :, None])
            bias = slopes.to(raw)[:, None, None] * distance
            raw, size = raw + bias, size + bias.abs()
        # c tanh(x / c) has slope at most 1: it never magnifies the scores' rounding.
        expected = raw if cap is None else cap * torch.tanh(raw / cap)
        size = size if cap is None else size + expected.abs()
        unmasked = s.isfinite()
        return Sides(s.where(unmasked, 0.0), expected.where(unmasked, 0.0), size)

    capped = "" if cap is None else f", soft-capped at {cap:g}"
    capped += "" if slopes is None else " + slope_h (k - q)"
    statement = f"{scores} == {q} . {k} / attn_scale{capped} (unmasked entries)"
    return Identity(statement, (scores, q, k), _names.axis_names(scores), PRODUCTS, sides)


def softmax(pattern: str, scores: str) -> Identity:
    """`pattern == softmax(scores)` over the key positions."""

    def sides(get: Get) -> Sides:
        s = get(scores)
        expected = s.softmax(dim=-1)
        # d softmax_i / d s_j = p_i (delta_ij - p_j): rounding each score by a relative
        # eps moves p_i by at most eps p_i (|s_i| + sum_j p_j |s_j|).
        size = s.abs().where(s.isfinite(), 0.0)
        scale = expected * (1 + size + (expected * size).sum(dim=-1, keepdim=True))
        return Sides(get(pattern), expected, scale)

    statement = f"{pattern} == softmax({scores}) over key_pos"
    scale_is = "the pattern times the scores' magnitude"
    return Identity(statement, (pattern, scores), _names.axis_names(pattern), scale_is, sides)


def rows_sum_to_one(pattern: str) -> Identity:
    """Every row of `pattern` sums to one."""

    def sides(get: Get) -> Sides:
        rows = get(pattern).sum(dim=-1)
        return Sides(rows, torch.ones_like(rows), torch.ones_like(rows))

    axes = _names.axis_names(pattern)[:-1]
    return Identity(f"{pattern} rows sum to 1", (pattern,), axes, VALUE, sides)


def _key_offsets(p: Tensor) -> Tensor:
    """`query - key` in stored positions, `[query_pos key_pos]`.

    With a KV cache (or a pos_slice keeping the last positions) the queries are the last
    n_query of the n_key positions; any other pos_slice only allows fewer keys.
    """
    n_query, n_key = p.shape[-2:]
    query = torch.arange(n_key - n_query, n_key, device=p.device)[:, None]
    return query - torch.arange(n_key, device=p.device)[None, :]


def causal(pattern: str) -> Identity:
    """`pattern` is zero on every key after its query."""

    def sides(get: Get) -> Sides:
        p = get(pattern)
        zero = torch.zeros_like(p)
        return Sides(p.where(_key_offsets(p) < 0, 0.0), zero, zero)

    statement = f"{pattern} is 0 on every key after its query"
    return Identity(statement, (pattern,), _names.axis_names(pattern), "zero", sides)


def windowed(pattern: str, window_size: int) -> Identity:
    """`pattern` is zero on keys `window_size` or more positions before the query."""

    def sides(get: Get) -> Sides:
        p = get(pattern)
        zero = torch.zeros_like(p)
        return Sides(p.where(_key_offsets(p) >= window_size, 0.0), zero, zero)

    statement = f"{pattern} is 0 on keys {window_size} or more positions before the query"
    return Identity(statement, (pattern,), _names.axis_names(pattern), "zero", sides)


_MIX = (
    "... kv_head group query_pos key_pos, ... key_pos kv_head d_head "
    "-> ... query_pos kv_head group d_head"
)


def mix_values(z: str, pattern: str, v: str, group: int, gate: str | None = None) -> Identity:
    """`z == pattern @ v`, each query head reading its group's value head; times the
    output gate, where the attention has one (`attn_gate`)."""

    def sides(get: Get) -> Sides:
        p, v_ = get(pattern), get(v)
        same_keys(v, v_.shape[-3], p.shape[-1])
        p = _grouped(p, group, "... (kv_head group) q k -> ... kv_head group q k")
        ungroup = "... q kv_head group d -> ... q (kv_head group) d"
        expected = rearrange(einsum(p, v_, _MIX), ungroup)
        size = rearrange(einsum(p.abs(), v_.abs(), _MIX), ungroup)
        if gate is not None:
            g = get(gate)
            expected, size = expected * g, size * g.abs()
        return Sides(get(z), expected, size)

    statement = f"{z} == {pattern} @ {v}" + ("" if gate is None else f" * {gate}")
    needs = (z, pattern, v) if gate is None else (z, pattern, v, gate)
    return Identity(statement, needs, _names.axis_names(z), PRODUCTS, sides)


def heads_sum(attn_out: str, result: str, b_O: nn.Parameter, post: NormAtScale | None) -> Identity:
    """`attn_out == post(sum over heads of result + b_O)`."""

    def sides(get: Get) -> Sides:
        r = get(result)
        bias = weight(b_O, r)
        total, size = r.sum(dim=-2) + bias, r.abs().sum(dim=-2) + bias.abs()
        if post is not None:
            total, size = post.apply(get, total, size)
        return Sides(get(attn_out), total, size)

    terms = f"sum over heads of {result} + b_O"
    statement = f"{attn_out} == {terms if post is None else f'{post.path}({terms})'}"
    needs = (attn_out, result) if post is None else (attn_out, result, post.scale)
    return Identity(statement, needs, _names.axis_names(attn_out), TERMS, sides)
