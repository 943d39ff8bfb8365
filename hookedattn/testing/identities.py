"""`assert_residual_identities`: every equation the forward promises, checked on a cache.

The residual stream is a sum. Each block reads it and adds what it writes, and each write
is itself a sum over heads or neurons; so a cache of one forward satisfies, in order:

    resid_pre[0]   = embed + pos_embed                      (embed alone: rotary, none)
    attn_in[h]     = resid_pre                              (per-head input copies)
    q, k, v        = ln1.normalized @ W_Q, W_K, W_V + biases
    attn_scores    = q k^T / attn_scale                     (unmasked entries)
    pattern        = softmax(attn_scores), rows sum to 1, 0 on future keys
    z              = pattern @ v
    attn_out       = sum_h result[h] + b_O = sum_h z[h] @ W_O[h] + b_O
    resid_mid      = resid_pre + attn_out                   (attn-only: resid_post)
    mlp_in         = resid_mid
    pre            = ln2.normalized @ W_in + b_in,  post = act_fn(pre)
    mlp_out        = post @ W_out + b_out
    resid_post     = resid_mid + mlp_out
    resid_pre[L+1] = resid_post[L]

An identity is checked when all its activations are in the cache, and skipped (and listed
as skipped) otherwise. The norms themselves (`hook_scale`, `ln_final`) and the rotation of
q and k are not recomputed here: that would mean calling the model's own modules, which
are what is under test.
"""

import dataclasses
from collections.abc import Callable

import torch
from einops import einsum
from torch import Tensor, nn

from hookedattn import names as _names
from hookedattn.cache import ActivationCache
from hookedattn.model import HookedTransformer
from hookedattn.testing._compare import (
    ToleranceUsed,
    axes_for,
    find_mismatch,
    loosest_tolerance,
    numbered,
)
from hookedattn.tolerances import Tolerance

Get = Callable[[str], Tensor]
_TERMS = "sum of the terms' magnitudes"
_PRODUCTS = "sum of the products' magnitudes"
_VALUE = "the expected value"


class _NotApplicableError(Exception):
    """The activations are cached but cannot be compared; the message says why."""


@dataclasses.dataclass(frozen=True)
class _Sides:
    actual: Tensor
    expected: Tensor
    scale: Tensor  # the magnitude rounding error lives at; see `_compare`


@dataclasses.dataclass(frozen=True)
class _Identity:
    statement: str
    needs: tuple[str, ...]
    axes: tuple[str, ...]  # of `actual`, batch first
    scale_is: str
    sides: Callable[[Get], _Sides]


@dataclasses.dataclass(frozen=True)
class IdentityCheck:
    """What `assert_residual_identities` checked (all held) and what it skipped, and why."""

    checked: tuple[str, ...]
    skipped: tuple[str, ...]
    tolerance: ToleranceUsed

    def __repr__(self) -> str:
        lines = [
            f"IdentityCheck: {len(self.checked)} identities hold at {self.tolerance}, "
            f"{len(self.skipped)} skipped"
        ]
        lines += [f"  ok    {s}" for s in self.checked]
        lines += [f"  skip  {s}" for s in self.skipped]
        return "\n".join(lines)


def assert_residual_identities(
    model: HookedTransformer, cache: ActivationCache, *, tol: Tolerance | None = None
) -> IdentityCheck:
    """Assert that every residual-stream identity (module docstring) holds on `cache`.

    `cache` is one forward of `model` (any `names_filter`, `pos_slice`, `dtype` or batch
    axis). The tolerance is the loosest of the cache's and the model's dtypes (from
    `hookedattn.tolerances`) unless `tol` is given. Raises `AssertionError` naming each
    failing identity with its largest error, where it is and the bound it broke, or when
    no identity could be checked at all. Returns what was checked and what was skipped.
    """
    if not isinstance(cache, ActivationCache):
        raise TypeError(f"cache must be an ActivationCache, got {type(cache).__name__}")
    dtypes = {t.dtype for t in cache.values()} | {model.cfg.dtype}
    used = loosest_tolerance(dtypes, tol)
    get: Get = lambda name: cache[name].to(torch.float64)
    checked, skipped, failures = [], [], []
    for identity in _identities(model):
        missing = [n for n in identity.needs if n not in cache]
        if missing:
            skipped.append(f"{identity.statement}  [not cached: {', '.join(missing)}]")
            continue
        try:
            sides = identity.sides(get)
        except _NotApplicableError as why:
            skipped.append(f"{identity.statement}  [{why}]")
            continue
        checked.append(identity.statement)
        mismatch = find_mismatch(sides.actual, sides.expected, sides.scale, used.tol)
        if mismatch is not None:
            axes = axes_for(identity.axes, sides.actual.ndim)
            failures.append((identity.statement, mismatch.describe(axes, used, identity.scale_is)))
    if failures:
        raise AssertionError(_failure_message(failures, len(checked), skipped, used))
    if not checked and skipped:  # a 0-layer model has no identities; that is not a failure
        raise AssertionError(
            f"none of the {len(skipped)} residual-stream identities could be checked on this "
            f"cache of {len(cache)} activations:\n  " + "\n  ".join(skipped)
        )
    return IdentityCheck(tuple(checked), tuple(skipped), used)


def _failure_message(
    failures: list[tuple[str, str]], n_checked: int, skipped: list[str], used: ToleranceUsed
) -> str:
    lines = [f"{len(failures)} of {n_checked} residual-stream identities fail at {used}:"]
    lines += numbered(failures)
    lines.append(
        "Look first at the earliest failure in forward order: an activation edited in place "
        "after it was cached, a hook that replaced one activation but not what reads it, or "
        "activations taken from two different runs break these."
    )
    if skipped:
        lines.append(f"Skipped {len(skipped)}: " + "; ".join(s.split("  [")[0] for s in skipped))
    return "\n".join(lines)


# ----------------------------------------------------------------- the identities
def _identities(model: HookedTransformer) -> list[_Identity]:
    """Every identity of `model`'s forward, in the order the forward computes them."""
    cfg = model.cfg
    out: list[_Identity] = []
    if cfg.n_layers:
        terms = ["embed", "pos_embed"] if cfg.positional_embedding_type == "standard" else ["embed"]
        out.append(_sum(_act("resid_pre", 0), *(_names.get_act_name(t) for t in terms)))
    for layer, block in enumerate(model.blocks):
        resid_pre = _act("resid_pre", layer)
        for copy in ("attn_in", "q_input", "k_input", "v_input"):
            if hasattr(block, f"hook_{copy}"):
                out.append(_per_head_copy(_act(copy, layer), resid_pre))
        out += _attention(model, layer)
        attn_out = _act("attn_out", layer)
        if cfg.attn_only:
            out.append(_sum(_act("resid_post", layer), resid_pre, attn_out))
        else:
            resid_mid = _act("resid_mid", layer)
            out.append(_sum(resid_mid, resid_pre, attn_out))
            out += _mlp(model, layer)
            out.append(_sum(_act("resid_post", layer), resid_mid, _act("mlp_out", layer)))
        if layer + 1 < cfg.n_layers:
            out.append(_sum(_act("resid_pre", layer + 1), _act("resid_post", layer)))
    return out


def _attention(model: HookedTransformer, layer: int) -> list[_Identity]:
    attn = model.blocks[layer].attn
    rotary = model.cfg.positional_embedding_type == "rotary"
    q, k = (_act("rot_q" if rotary else "q", layer), _act("rot_k" if rotary else "k", layer))
    v, z, result = _act("v", layer), _act("z", layer), _act("result", layer)
    scores, pattern = _act("attn_scores", layer), _act("pattern", layer)
    attn_out = _act("attn_out", layer)
    out = [
        *_projections(model, layer),
        _scores(scores, q, k, model.cfg.attn_scale),
        _softmax(pattern, scores),
        _rows_sum_to_one(pattern),
        _causal(pattern),
        _mix_values(z, pattern, v),
    ]
    if hasattr(attn, "hook_result"):
        out.append(_heads_sum(attn_out, result, attn.b_O))
    out.append(_linear(attn_out, z, attn.W_O, attn.b_O, _WRITE, "W_O + b_O, summed over heads"))
    return out


_READ = "... d_model, head d_model d_head -> ... head d_head"
_READ_PER_HEAD = "... head d_model, head d_model d_head -> ... head d_head"
_WRITE = "... head d_head, head d_head d_model -> ... d_model"


def _projections(model: HookedTransformer, layer: int) -> list[_Identity]:
    """`q, k, v == input @ W_Q, W_K, W_V (+ biases)`, where the input is unambiguous.

    With `use_split_qkv_input` and a norm, `ln1` runs three times (on the q, k and v
    inputs) and its hook point records only the last, so those are not checked.
    """
    cfg, block = model.cfg, model.blocks[layer]
    split = hasattr(block, "hook_q_input")
    if split and cfg.normalization_type is not None:
        return []
    out = []
    for x in ("q", "k", "v"):
        if cfg.normalization_type is not None:
            source = _names.get_act_name("normalized", layer, "ln1")
        elif split:
            source = _act(f"{x}_input", layer)
        else:
            source = _act("attn_in" if hasattr(block, "hook_attn_in") else "resid_pre", layer)
        per_head = split or hasattr(block, "hook_attn_in")
        W, b = (getattr(block.attn, f"{w}_{x.upper()}") for w in ("W", "b"))
        weights = f"W_{x.upper()} + b_{x.upper()}"
        out.append(
            _linear(_act(x, layer), source, W, b, _READ_PER_HEAD if per_head else _READ, weights)
        )
    return out


def _mlp(model: HookedTransformer, layer: int) -> list[_Identity]:
    block = model.blocks[layer]
    mlp = block.mlp
    pre, post, mlp_out = _act("pre", layer), _act("post", layer), _act("mlp_out", layer)
    out = []
    if hasattr(block, "hook_mlp_in"):
        out.append(_sum(_act("mlp_in", layer), _act("resid_mid", layer)))
    if model.cfg.normalization_type is not None:
        source = _names.get_act_name("normalized", layer, "ln2")
    else:
        source = _act("mlp_in" if hasattr(block, "hook_mlp_in") else "resid_mid", layer)
    out.append(
        _linear(
            pre,
            source,
            mlp.W_in,
            mlp.b_in,
            "... d_model, d_model d_mlp -> ... d_mlp",
            "W_in + b_in",
        )
    )
    out.append(_activation(post, pre, mlp.act_fn))
    out.append(
        _linear(
            mlp_out,
            post,
            mlp.W_out,
            mlp.b_out,
            "... d_mlp, d_mlp d_model -> ... d_model",
            "W_out + b_out",
        )
    )
    return out


def _act(name: str, layer: int) -> str:
    return _names.get_act_name(name, layer)


def _sum(total: str, *terms: str) -> _Identity:
    def sides(get: Get) -> _Sides:
        values = [get(t) for t in terms]
        return _Sides(get(total), sum(values), sum(v.abs() for v in values))

    scale_is = _TERMS if len(terms) > 1 else _VALUE
    statement = f"{total} == {' + '.join(terms)}"
    return _Identity(statement, (total, *terms), _names.axis_names(total), scale_is, sides)


def _per_head_copy(copy: str, resid: str) -> _Identity:
    def sides(get: Get) -> _Sides:
        stream = get(resid).unsqueeze(-2)  # [... pos 1 d_model], broadcast over heads
        return _Sides(get(copy), stream, stream.abs())

    statement = f"{copy}[..., head, :] == {resid} for every head"
    return _Identity(statement, (copy, resid), _names.axis_names(copy), _VALUE, sides)


def _scores(scores: str, q: str, k: str, attn_scale: float) -> _Identity:
    qk = "... query_pos head d_head, ... key_pos head d_head -> ... head query_pos key_pos"

    def sides(get: Get) -> _Sides:
        q_, k_, s = get(q), get(k), get(scores)
        _same_keys(k, k_.shape[-3], s.shape[-1])
        unmasked = s.isfinite()
        expected = einsum(q_, k_, qk) / attn_scale
        scale = einsum(q_.abs(), k_.abs(), qk) / attn_scale
        return _Sides(s.where(unmasked, 0.0), expected.where(unmasked, 0.0), scale)

    statement = f"{scores} == {q} . {k} / attn_scale (unmasked entries)"
    return _Identity(statement, (scores, q, k), _names.axis_names(scores), _PRODUCTS, sides)


def _softmax(pattern: str, scores: str) -> _Identity:
    def sides(get: Get) -> _Sides:
        s = get(scores)
        expected = s.softmax(dim=-1)
        # d softmax_i / d s_j = p_i (delta_ij - p_j): rounding each score by a relative
        # eps moves p_i by at most eps p_i (|s_i| + sum_j p_j |s_j|).
        size = s.abs().where(s.isfinite(), 0.0)
        scale = expected * (1 + size + (expected * size).sum(dim=-1, keepdim=True))
        return _Sides(get(pattern), expected, scale)

    statement = f"{pattern} == softmax({scores}) over key_pos"
    scale_is = "the pattern times the scores' magnitude"
    return _Identity(statement, (pattern, scores), _names.axis_names(pattern), scale_is, sides)


def _rows_sum_to_one(pattern: str) -> _Identity:
    def sides(get: Get) -> _Sides:
        rows = get(pattern).sum(dim=-1)
        return _Sides(rows, torch.ones_like(rows), torch.ones_like(rows))

    axes = _names.axis_names(pattern)[:-1]
    return _Identity(f"{pattern} rows sum to 1", (pattern,), axes, _VALUE, sides)


def _causal(pattern: str) -> _Identity:
    def sides(get: Get) -> _Sides:
        p = get(pattern)
        n_query, n_key = p.shape[-2:]
        # With a KV cache (or a pos_slice keeping the last positions) the queries are the
        # last n_query of the n_key positions; any other pos_slice only allows fewer keys.
        future = torch.ones(n_query, n_key, dtype=torch.bool, device=p.device)
        future = future.triu(n_key - n_query + 1)
        zero = torch.zeros_like(p)
        return _Sides(p.where(future, 0.0), zero, zero)

    statement = f"{pattern} is 0 on every key after its query"
    return _Identity(statement, (pattern,), _names.axis_names(pattern), "zero", sides)


def _mix_values(z: str, pattern: str, v: str) -> _Identity:
    mix = "... head query_pos key_pos, ... key_pos head d_head -> ... query_pos head d_head"

    def sides(get: Get) -> _Sides:
        p, v_ = get(pattern), get(v)
        _same_keys(v, v_.shape[-3], p.shape[-1])
        return _Sides(get(z), einsum(p, v_, mix), einsum(p.abs(), v_.abs(), mix))

    statement = f"{z} == {pattern} @ {v}"
    return _Identity(statement, (z, pattern, v), _names.axis_names(z), _PRODUCTS, sides)


def _heads_sum(attn_out: str, result: str, b_O: nn.Parameter) -> _Identity:
    def sides(get: Get) -> _Sides:
        r = get(result)
        bias = _weight(b_O, r)
        return _Sides(get(attn_out), r.sum(dim=-2) + bias, r.abs().sum(dim=-2) + bias.abs())

    statement = f"{attn_out} == sum over heads of {result} + b_O"
    return _Identity(statement, (attn_out, result), _names.axis_names(attn_out), _TERMS, sides)


def _linear(
    out: str, x: str, W: nn.Parameter, b: nn.Parameter, pattern: str, weights: str
) -> _Identity:
    """`out == einsum(x, W, pattern) + b`; `weights` names them in the statement."""

    def sides(get: Get) -> _Sides:
        x_ = get(x)
        W_, b_ = _weight(W, x_), _weight(b, x_)
        expected = einsum(x_, W_, pattern) + b_
        return _Sides(get(out), expected, einsum(x_.abs(), W_.abs(), pattern) + b_.abs())

    statement = f"{out} == {x} @ {weights}"
    return _Identity(statement, (out, x), _names.axis_names(out), _PRODUCTS, sides)


def _activation(post: str, pre: str, act_fn: Callable[[Tensor], Tensor]) -> _Identity:
    def sides(get: Get) -> _Sides:
        expected = act_fn(get(pre))
        return _Sides(get(post), expected, expected)

    statement = f"{post} == act_fn({pre})"
    return _Identity(statement, (post, pre), _names.axis_names(post), _VALUE, sides)


def _weight(param: nn.Parameter, like: Tensor) -> Tensor:
    return param.detach().to(device=like.device, dtype=torch.float64)


def _same_keys(name: str, n_positions: int, n_keys: int) -> None:
    if n_positions != n_keys:
        raise _NotApplicableError(
            f"{name} has {n_positions} positions but there are {n_keys} key positions: a "
            f"pos_slice or a KV cache"
        )
