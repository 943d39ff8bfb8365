"""What an identity of the residual stream is, and the ones every part of a model shares.

An `Identity` states an equation between cached activations and computes both sides from
a cache (in float64) with the magnitude its rounding error lives at; `assert_residual_identities`
compares them. Here: sums, per-head copies, linear maps (optionally through a norm applied
at its recorded divisor, and a soft cap), activations, and the small helpers they share.
"""

import dataclasses
from collections.abc import Callable

import torch
from einops import einsum
from torch import Tensor, nn

from hookedattn.core import names as _names
from hookedattn.core.components.norm import LayerNormPre

Get = Callable[[str], Tensor]
TERMS = "sum of the terms' magnitudes"
PRODUCTS = "sum of the products' magnitudes"
VALUE = "the expected value"


class NotApplicableError(Exception):
    """The activations are cached but cannot be compared; the message says why."""


@dataclasses.dataclass(frozen=True)
class Sides:
    """Both sides of an identity in float64, and the magnitude rounding error lives at."""

    actual: Tensor
    expected: Tensor
    scale: Tensor  # the magnitude rounding error lives at; see `_compare`


@dataclasses.dataclass(frozen=True)
class Identity:
    """One equation: its statement, the activations it needs, the axes of its left side,
    what its tolerance is relative to, and how to compute both sides from a cache."""

    statement: str
    needs: tuple[str, ...]
    axes: tuple[str, ...]  # of `actual`, batch first
    scale_is: str
    sides: Callable[[Get], Sides]


@dataclasses.dataclass(frozen=True)
class NormAtScale:
    """A norm module at hook path `path`, applied at the divisor its forward recorded."""

    path: str
    module: nn.Module

    @property
    def scale(self) -> str:
        """The hook name of the divisor the norm's forward recorded."""
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
            x, size = x * weight(gain, x), size * weight(gain, x).abs()
        if bias is not None:
            x, size = x + weight(bias, x), size + weight(bias, x).abs()
        return x, size


def sum_of(total: str, *terms: str) -> Identity:
    """`total == terms[0] + terms[1] + ...`."""

    def sides(get: Get) -> Sides:
        values = [get(t) for t in terms]
        return Sides(get(total), sum(values), sum(v.abs() for v in values))

    scale_is = TERMS if len(terms) > 1 else VALUE
    statement = f"{total} == {' + '.join(terms)}"
    return Identity(statement, (total, *terms), _names.axis_names(total), scale_is, sides)


def per_head_copy(copy: str, resid: str) -> Identity:
    """`copy[..., head, :] == resid` for every head (the per-head input copies)."""

    def sides(get: Get) -> Sides:
        stream = get(resid).unsqueeze(-2)  # [... pos 1 d_model], broadcast over heads
        return Sides(get(copy), stream, stream.abs())

    statement = f"{copy}[..., head, :] == {resid} for every head"
    return Identity(statement, (copy, resid), _names.axis_names(copy), VALUE, sides)


def linear(
    out: str,
    x: str,
    W: Tensor,
    b: Tensor | None,
    pattern: str,
    weights: str,
    post: NormAtScale | None = None,
    cap: float | None = None,
    added: str | None = None,
) -> Identity:
    """`out == post(einsum(x, W, pattern) + b)`, or `cap(...)` with a soft cap; `weights`
    names them in the statement, `post` is the norm after a sublayer (if any), `added` an
    activation added to `x` first (a shortformer's positions, the same for every head)."""

    def sides(get: Get) -> Sides:
        x_ = get(x)
        if added is not None:
            extra = get(added)
            x_ = x_ + (extra if extra.ndim == x_.ndim else extra.unsqueeze(-2))
        W_ = weight(W, x_)
        expected, size = einsum(x_, W_, pattern), einsum(x_.abs(), W_.abs(), pattern)
        if b is not None:
            expected, size = expected + weight(b, x_), size + weight(b, x_).abs()
        if post is not None:
            expected, size = post.apply(get, expected, size)
        if cap is not None:
            expected = cap * torch.tanh(expected / cap)
            size = size + expected.abs()
        return Sides(get(out), expected, size)

    product = f"{x} @ {weights}" if added is None else f"({x} + {added}) @ {weights}"
    statement = f"{out} == {product if post is None else f'{post.path}({product})'}"
    needs = (out, x) if added is None else (out, x, added)
    needs = needs if post is None else (*needs, post.scale)
    axes = _names.axis_names(out) or ("batch", "pos", pattern.rsplit(" ", 1)[-1])
    return Identity(statement, needs, axes, PRODUCTS, sides)


def activation(post: str, pre: str, act_fn: Callable[[Tensor], Tensor]) -> Identity:
    """`post == act_fn(pre)`."""

    def sides(get: Get) -> Sides:
        expected = act_fn(get(pre))
        return Sides(get(post), expected, expected)

    statement = f"{post} == act_fn({pre})"
    return Identity(statement, (post, pre), _names.axis_names(post), VALUE, sides)


def gated_activation(
    post: str, pre: str, pre_linear: str, act_fn: Callable[[Tensor], Tensor]
) -> Identity:
    """`post == act_fn(pre) * pre_linear` (a gated MLP)."""

    def sides(get: Get) -> Sides:
        expected = act_fn(get(pre)) * get(pre_linear)
        return Sides(get(post), expected, expected)

    statement = f"{post} == act_fn({pre}) * {pre_linear}"
    return Identity(statement, (post, pre, pre_linear), _names.axis_names(post), VALUE, sides)


def weight(param: Tensor, like: Tensor) -> Tensor:
    """A parameter as a float64 constant on the device of `like`."""
    return param.detach().to(device=like.device, dtype=torch.float64)


def same_keys(name: str, n_positions: int, n_keys: int) -> None:
    """Refuse (as not applicable) a cache whose keys are not the pattern's key positions."""
    if n_positions != n_keys:
        raise NotApplicableError(
            f"{name} has {n_positions} positions but there are {n_keys} key positions: a "
            f"pos_slice or a KV cache"
        )
