"""`assert_residual_identities`: every equation the forward promises, checked on a cache.

The residual stream is a sum. Each block reads it and adds what it writes, and each write
is itself a sum over heads or neurons; so a cache of one forward satisfies, in order:

    resid_pre[0]   = embed + pos_embed                      (embed alone: rotary, none)
    attn_in[h]     = resid_pre                              (per-head input copies)
    q, k, v        = ln1.out @ W_Q, W_K, W_V + biases       (resid_pre where no ln1)
    q_norm.normalized = q / q_norm.scale, q_norm.out = w q_norm.normalized (likewise k)
    attn_scores    = cap(q k^T / attn_scale)                (unmasked entries; rot_q, rot_k
                                                             or the normed q, k if any)
    pattern        = softmax(attn_scores), rows sum to 1, 0 on future keys
                     and, in a local layer, on keys window_size or more positions back
    z              = pattern @ v
    attn_out       = after(sum_h result[h] + b_O) = after(sum_h z[h] @ W_O[h] + b_O)
    resid_mid      = resid_pre + attn_out                   (attn-only: resid_post)
    mlp_in         = resid_mid                              (parallel: resid_pre)
    pre            = ln2.out @ W_in + b_in,         post = act_fn(pre)
                     gated: pre = x @ W_gate, pre_linear = x @ W_in + b_in,
                            post = act_fn(pre) * pre_linear
    mlp_out        = after(post @ W_out + b_out)
    resid_post     = resid_mid + mlp_out                    (parallel: resid_pre +
                                                             attn_out + mlp_out)
    resid_pre[L+1] = resid_post[L]
    unembed.in     = ln_final.out,         unembed.out = cap(unembed.in @ W_U + b_U)

with `<norm>.out` a norm's output after its gain and bias (`hook_normalized` is before
them), GQA keys and values one per key/value head (each query head reads its group's),
`after` the norm after a sublayer (`ln1_post`, `ln2_post`; the identity elsewhere) and `cap`
a soft cap (`c tanh(x / c)`; the identity elsewhere).

An identity is checked when all its activations are in the cache, and skipped (and listed
as skipped) otherwise. The norms before a sublayer (`ln1`, `ln2`, `ln_final`), their
`hook_scale` and the rotation of q and k are not recomputed here: that would mean calling
the model's own modules, which are what is under test. A norm inside a chain of identities
(after a sublayer; on queries and keys) is applied at the divisor its forward recorded, so
its gain, bias and centring are checked, and its divisor is not.
"""

import dataclasses
from collections.abc import Callable

import torch
from einops import einsum, rearrange
from torch import Tensor, nn

from hookedattn import names as _names
from hookedattn.cache import ActivationCache
from hookedattn.components.norm import LayerNormPre, NoNorm
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
    if not cfg.n_layers:
        return out
    terms = ["embed", "pos_embed"] if cfg.positional_embedding_type == "standard" else ["embed"]
    out.append(_sum(_act("resid_pre", 0), *(_names.get_act_name(t) for t in terms)))
    for layer in range(cfg.n_layers):
        out += _block(model, layer)
        if layer + 1 < cfg.n_layers:
            out.append(_sum(_act("resid_pre", layer + 1), _act("resid_post", layer)))
    paths = [f"blocks.{layer}.{which}" for layer in range(cfg.n_layers) for which in _NORMS]
    out += [_gain(model, path) for path in [*paths, "ln_final"] if _has_norm(model, path)]
    return out + _unembed(model)


_NORMS = ("ln1", "ln2", "ln1_post", "ln2_post")


def _has_norm(model: HookedTransformer, path: str) -> bool:
    try:
        return not isinstance(model.get_submodule(path), NoNorm)
    except AttributeError:  # a block without that norm (an attention-only block's ln2)
        return False


def _gain(model: HookedTransformer, path: str) -> _Identity:
    """`<path>.hook_out == <path>.hook_normalized * w + b`: the gain and bias after the
    division (the identity for the weightless forms)."""
    module = model.get_submodule(path)
    normalized, out = f"{path}.hook_normalized", f"{path}.hook_out"
    gain, bias = getattr(module, "w", None), getattr(module, "b", None)

    def sides(get: Get) -> _Sides:
        x = get(normalized)
        expected, size = x, x.abs()
        if gain is not None:
            expected, size = expected * _weight(gain, x), size * _weight(gain, x).abs()
        if bias is not None:
            expected, size = expected + _weight(bias, x), size + _weight(bias, x).abs()
        return _Sides(get(out), expected, size)

    statement = f"{out} == {normalized} * w + b"
    return _Identity(statement, (out, normalized), ("batch", "pos", "d_model"), _TERMS, sides)


def _block(model: HookedTransformer, layer: int) -> list[_Identity]:
    """One block: its per-head copies, attention, MLP and residual sums.

    A sequential block adds the attention's write before the MLP reads the stream; a
    parallel one (`parallel_attn_mlp`) gives both sublayers `resid_pre` and adds both.
    """
    cfg, block = model.cfg, model.blocks[layer]
    resid_pre, resid_post = _act("resid_pre", layer), _act("resid_post", layer)
    out = []
    for copy in ("attn_in", "q_input", "k_input", "v_input"):
        if hasattr(block, f"hook_{copy}"):
            out.append(_per_head_copy(_act(copy, layer), resid_pre))
    out += _attention(model, layer)
    attn_out = _act("attn_out", layer)
    if cfg.attn_only:
        return [*out, _sum(resid_post, resid_pre, attn_out)]
    mlp_out = _act("mlp_out", layer)
    if cfg.parallel_attn_mlp:
        out += _mlp(model, layer, resid_pre)
        return [*out, _sum(resid_post, resid_pre, attn_out, mlp_out)]
    resid_mid = _act("resid_mid", layer)
    out.append(_sum(resid_mid, resid_pre, attn_out))
    out += _mlp(model, layer, resid_mid)
    return [*out, _sum(resid_post, resid_mid, mlp_out)]


def _attention(model: HookedTransformer, layer: int) -> list[_Identity]:
    cfg, attn = model.cfg, model.blocks[layer].attn
    prefix = f"blocks.{layer}.attn"
    q, k = _act("q", layer), _act("k", layer)
    out = [*_projections(model, layer)]
    for name, which in ((q, "q_norm"), (k, "k_norm")):
        out += _norm_identity(model, f"{prefix}.{which}", name)
    if cfg.positional_embedding_type == "rotary":
        q, k = _act("rot_q", layer), _act("rot_k", layer)
    elif cfg.use_qk_norm:
        q, k = f"{prefix}.q_norm.hook_out", f"{prefix}.k_norm.hook_out"
    v, z, result = _act("v", layer), _act("z", layer), _act("result", layer)
    scores, pattern = _act("attn_scores", layer), _act("pattern", layer)
    attn_out = _act("attn_out", layer)
    out += [
        _scores(scores, q, k, cfg.attn_scale, attn.group, cfg.attn_scores_soft_cap),
        _softmax(pattern, scores),
        _rows_sum_to_one(pattern),
        _causal(pattern),
    ]
    if attn.attn_type == "local":
        out.append(_windowed(pattern, cfg.window_size))
    out.append(_mix_values(z, pattern, v, attn.group))
    post = _placed_norm(model, layer, "ln1_post")
    if hasattr(attn, "hook_result"):
        out.append(_heads_sum(attn_out, result, attn.b_O, post))
    out.append(
        _linear(attn_out, z, attn.W_O, attn.b_O, _WRITE, "W_O + b_O, summed over heads", post)
    )
    return out


_READ = "... d_model, head d_model d_head -> ... head d_head"
_READ_PER_HEAD = "... head d_model, head d_model d_head -> ... head d_head"
_WRITE = "... head d_head, head d_head d_model -> ... d_model"


def _projections(model: HookedTransformer, layer: int) -> list[_Identity]:
    """`q, k, v == input @ W_Q, W_K, W_V (+ biases)`, where the input is unambiguous.

    Keys and values are checked against the weights as stored, one per key/value head.
    With `use_split_qkv_input` and a norm, `ln1` runs three times (on the q, k and v
    inputs) and its hook point records only the last, so those are not checked.
    """
    block = model.blocks[layer]
    split = hasattr(block, "hook_q_input")
    normed = not isinstance(block.ln1, NoNorm)
    if split and normed:
        return []
    W_K, b_K, W_V, b_V = block.attn.key_value_weights()
    weights = {"q": (block.attn.W_Q, block.attn.b_Q), "k": (W_K, b_K), "v": (W_V, b_V)}
    per_head = split or hasattr(block, "hook_attn_in")
    out = []
    for x, (W, b) in weights.items():
        if normed:
            source = f"blocks.{layer}.ln1.hook_out"
        elif split:
            source = _act(f"{x}_input", layer)
        else:
            source = _act("attn_in" if hasattr(block, "hook_attn_in") else "resid_pre", layer)
        pattern = _READ_PER_HEAD if per_head else _READ
        label = f"W_{x.upper()} + b_{x.upper()}"
        out.append(_linear(_act(x, layer), source, W, b, pattern, label))
    return out


def _mlp(model: HookedTransformer, layer: int, stream: str) -> list[_Identity]:
    """The MLP of block `layer`, which reads the residual stream `stream`."""
    block = model.blocks[layer]
    mlp = block.mlp
    pre, post, mlp_out = _act("pre", layer), _act("post", layer), _act("mlp_out", layer)
    out = []
    if hasattr(block, "hook_mlp_in"):
        out.append(_sum(_act("mlp_in", layer), stream))
        stream = _act("mlp_in", layer)
    if not isinstance(block.ln2, NoNorm):
        stream = f"blocks.{layer}.ln2.hook_out"
    read = "... d_model, d_model d_mlp -> ... d_mlp"
    if hasattr(mlp, "W_gate"):
        pre_linear = _act("pre_linear", layer)
        out.append(_linear(pre, stream, mlp.W_gate, None, read, "W_gate"))
        out.append(_linear(pre_linear, stream, mlp.W_in, mlp.b_in, read, "W_in + b_in"))
        out.append(_gated_activation(post, pre, pre_linear, mlp.act_fn))
    else:
        out.append(_linear(pre, stream, mlp.W_in, mlp.b_in, read, "W_in + b_in"))
        out.append(_activation(post, pre, mlp.act_fn))
    write = "... d_mlp, d_mlp d_model -> ... d_model"
    placed = _placed_norm(model, layer, "ln2_post")
    out.append(_linear(mlp_out, post, mlp.W_out, mlp.b_out, write, "W_out + b_out", placed))
    return out


def _unembed(model: HookedTransformer) -> list[_Identity]:
    """What the unembedding reads (the final norm's output) and the logits it returns."""
    final = _act("resid_post", model.cfg.n_layers - 1)
    read = final if isinstance(model.ln_final, NoNorm) else "ln_final.hook_out"
    out = [_sum("unembed.hook_in", read)]
    unembed = model.unembed
    cap = model.cfg.output_logits_soft_cap
    logits = _linear(
        "unembed.hook_out",
        "unembed.hook_in",
        unembed.W_U,
        unembed.b_U,
        "... d_model, d_model d_vocab_out -> ... d_vocab_out",
        "W_U + b_U" if cap is None else "W_U + b_U, soft-capped",
        cap=cap,
    )
    return [*out, logits]


def _act(name: str, layer: int) -> str:
    return _names.get_act_name(name, layer)


# ----------------------------------------------------------------- norms at their scale
@dataclasses.dataclass(frozen=True)
class _Norm:
    """A norm module at hook path `path`, applied at the divisor its forward recorded."""

    path: str
    module: nn.Module

    @property
    def scale(self) -> str:
        return f"{self.path}.hook_scale"

    def apply(
        self, get: Get, x: Tensor, size: Tensor, affine: bool = True
    ) -> tuple[Tensor, Tensor]:
        """`x` through the norm, and the magnitude its rounding error lives at (`size` is
        that of `x`); `affine=False` stops before the gain and bias (`hook_normalized`)."""
        if isinstance(self.module, LayerNormPre):
            axes = self.module.axes
            x = x - x.mean(axes, keepdim=True)
            size = size + size.mean(axes, keepdim=True)
        divisor = get(self.scale)
        x, size = x / divisor, size / divisor
        if not affine:
            return x, size
        gain, bias = getattr(self.module, "w", None), getattr(self.module, "b", None)
        if gain is not None:
            x, size = x * _weight(gain, x), size * _weight(gain, x).abs()
        if bias is not None:
            x, size = x + _weight(bias, x), size + _weight(bias, x).abs()
        return x, size


def _placed_norm(model: HookedTransformer, layer: int, which: str) -> _Norm | None:
    """The norm `which` of block `layer` (`ln1_post`...), or None where it is the identity."""
    module = getattr(model.blocks[layer], which, None)
    if module is None or isinstance(module, NoNorm):
        return None
    return _Norm(f"blocks.{layer}.{which}", module)


def _norm_identity(model: HookedTransformer, path: str, x: str) -> list[_Identity]:
    """`<path>.hook_normalized` and `<path>.hook_out` are norm(x) before and after the gain
    and bias, at its recorded scale; none where there is no norm."""
    module = model.get_submodule(path)
    if isinstance(module, NoNorm):
        return []
    norm = _Norm(path, module)
    axes = _names.axis_names(x)

    def identity(hook: str, affine: bool, what: str) -> _Identity:
        def sides(get: Get) -> _Sides:
            x_ = get(x)
            expected, size = norm.apply(get, x_, x_.abs(), affine)
            return _Sides(get(hook), expected, size)

        statement = f"{hook} == {path}({x}){what} at its recorded hook_scale"
        return _Identity(statement, (hook, x, norm.scale), axes, _TERMS, sides)

    return [
        identity(f"{path}.hook_normalized", False, " before its gain"),
        identity(f"{path}.hook_out", True, ""),
    ]


# ----------------------------------------------------------------- one identity each
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


def _grouped(heads: Tensor, group: int, pattern: str) -> Tensor:
    """Split a query-head axis into `kv_head group`: query head `h` reads key/value head
    `h // group`."""
    return rearrange(heads, pattern, group=group)


_QK = (
    "... query_pos kv_head group d_head, ... key_pos kv_head d_head "
    "-> ... kv_head group query_pos key_pos"
)


def _scores(
    scores: str, q: str, k: str, attn_scale: float, group: int, cap: float | None
) -> _Identity:
    def sides(get: Get) -> _Sides:
        q_, k_, s = get(q), get(k), get(scores)
        _same_keys(k, k_.shape[-3], s.shape[-1])
        q_ = _grouped(q_, group, "... p (kv_head group) d -> ... p kv_head group d")
        ungroup = "... kv_head group q k -> ... (kv_head group) q k"
        raw = rearrange(einsum(q_, k_, _QK), ungroup) / attn_scale
        size = rearrange(einsum(q_.abs(), k_.abs(), _QK), ungroup) / attn_scale
        # c tanh(x / c) has slope at most 1: it never magnifies the scores' rounding.
        expected = raw if cap is None else cap * torch.tanh(raw / cap)
        size = size if cap is None else size + expected.abs()
        unmasked = s.isfinite()
        return _Sides(s.where(unmasked, 0.0), expected.where(unmasked, 0.0), size)

    capped = "" if cap is None else f", soft-capped at {cap:g}"
    statement = f"{scores} == {q} . {k} / attn_scale{capped} (unmasked entries)"
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


def _key_offsets(p: Tensor) -> Tensor:
    """`query - key` in stored positions, `[query_pos key_pos]`.

    With a KV cache (or a pos_slice keeping the last positions) the queries are the last
    n_query of the n_key positions; any other pos_slice only allows fewer keys.
    """
    n_query, n_key = p.shape[-2:]
    query = torch.arange(n_key - n_query, n_key, device=p.device)[:, None]
    return query - torch.arange(n_key, device=p.device)[None, :]


def _causal(pattern: str) -> _Identity:
    def sides(get: Get) -> _Sides:
        p = get(pattern)
        zero = torch.zeros_like(p)
        return _Sides(p.where(_key_offsets(p) < 0, 0.0), zero, zero)

    statement = f"{pattern} is 0 on every key after its query"
    return _Identity(statement, (pattern,), _names.axis_names(pattern), "zero", sides)


def _windowed(pattern: str, window_size: int) -> _Identity:
    def sides(get: Get) -> _Sides:
        p = get(pattern)
        zero = torch.zeros_like(p)
        return _Sides(p.where(_key_offsets(p) >= window_size, 0.0), zero, zero)

    statement = f"{pattern} is 0 on keys {window_size} or more positions before the query"
    return _Identity(statement, (pattern,), _names.axis_names(pattern), "zero", sides)


_MIX = (
    "... kv_head group query_pos key_pos, ... key_pos kv_head d_head "
    "-> ... query_pos kv_head group d_head"
)


def _mix_values(z: str, pattern: str, v: str, group: int) -> _Identity:
    def sides(get: Get) -> _Sides:
        p, v_ = get(pattern), get(v)
        _same_keys(v, v_.shape[-3], p.shape[-1])
        p = _grouped(p, group, "... (kv_head group) q k -> ... kv_head group q k")
        ungroup = "... q kv_head group d -> ... q (kv_head group) d"
        expected = rearrange(einsum(p, v_, _MIX), ungroup)
        return _Sides(get(z), expected, rearrange(einsum(p.abs(), v_.abs(), _MIX), ungroup))

    statement = f"{z} == {pattern} @ {v}"
    return _Identity(statement, (z, pattern, v), _names.axis_names(z), _PRODUCTS, sides)


def _heads_sum(attn_out: str, result: str, b_O: nn.Parameter, post: _Norm | None) -> _Identity:
    def sides(get: Get) -> _Sides:
        r = get(result)
        bias = _weight(b_O, r)
        total, size = r.sum(dim=-2) + bias, r.abs().sum(dim=-2) + bias.abs()
        if post is not None:
            total, size = post.apply(get, total, size)
        return _Sides(get(attn_out), total, size)

    terms = f"sum over heads of {result} + b_O"
    statement = f"{attn_out} == {terms if post is None else f'{post.path}({terms})'}"
    needs = (attn_out, result) if post is None else (attn_out, result, post.scale)
    return _Identity(statement, needs, _names.axis_names(attn_out), _TERMS, sides)


def _linear(
    out: str,
    x: str,
    W: Tensor,
    b: Tensor | None,
    pattern: str,
    weights: str,
    post: _Norm | None = None,
    cap: float | None = None,
) -> _Identity:
    """`out == post(einsum(x, W, pattern) + b)`, or `cap(...)` with a soft cap; `weights`
    names them in the statement, `post` is the norm after a sublayer (if any)."""

    def sides(get: Get) -> _Sides:
        x_ = get(x)
        W_ = _weight(W, x_)
        expected, size = einsum(x_, W_, pattern), einsum(x_.abs(), W_.abs(), pattern)
        if b is not None:
            expected, size = expected + _weight(b, x_), size + _weight(b, x_).abs()
        if post is not None:
            expected, size = post.apply(get, expected, size)
        if cap is not None:
            expected = cap * torch.tanh(expected / cap)
            size = size + expected.abs()
        return _Sides(get(out), expected, size)

    product = f"{x} @ {weights}"
    statement = f"{out} == {product if post is None else f'{post.path}({product})'}"
    needs = (out, x) if post is None else (out, x, post.scale)
    axes = _names.axis_names(out) or ("batch", "pos", pattern.rsplit(" ", 1)[-1])
    return _Identity(statement, needs, axes, _PRODUCTS, sides)


def _activation(post: str, pre: str, act_fn: Callable[[Tensor], Tensor]) -> _Identity:
    def sides(get: Get) -> _Sides:
        expected = act_fn(get(pre))
        return _Sides(get(post), expected, expected)

    statement = f"{post} == act_fn({pre})"
    return _Identity(statement, (post, pre), _names.axis_names(post), _VALUE, sides)


def _gated_activation(
    post: str, pre: str, pre_linear: str, act_fn: Callable[[Tensor], Tensor]
) -> _Identity:
    def sides(get: Get) -> _Sides:
        expected = act_fn(get(pre)) * get(pre_linear)
        return _Sides(get(post), expected, expected)

    statement = f"{post} == act_fn({pre}) * {pre_linear}"
    return _Identity(statement, (post, pre, pre_linear), _names.axis_names(post), _VALUE, sides)


def _weight(param: Tensor, like: Tensor) -> Tensor:
    return param.detach().to(device=like.device, dtype=torch.float64)


def _same_keys(name: str, n_positions: int, n_keys: int) -> None:
    if n_positions != n_keys:
        raise _NotApplicableError(
            f"{name} has {n_positions} positions but there are {n_keys} key positions: a "
            f"pos_slice or a KV cache"
        )
