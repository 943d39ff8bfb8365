"""Elementwise comparison at a tolerance, and the words that say where it failed.

Every helper in `hookedattn.testing` reduces to one question: is `|actual - expected| <=
atol + rtol * scale` at every element? `scale` is the magnitude the rounding error lives
at: for a sum it is the sum of the terms' magnitudes (floating-point error of a sum grows
with its terms, not with its result, which may cancel to zero); for a plain comparison it
is the expected value itself, as in `torch.isclose`.
"""

import dataclasses
from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from hookedattn.core.tolerances import Tolerance, tolerance


@dataclasses.dataclass(frozen=True)
class ToleranceUsed:
    """A tolerance and where it came from (`"float32"`, or `"given"` when passed in)."""

    tol: Tolerance
    source: str

    def __str__(self) -> str:
        return f"{self.source} tolerance (rtol {self.tol.rtol:g}, atol {self.tol.atol:g})"


def loosest_tolerance(dtypes: Iterable[torch.dtype], given: Tolerance | None) -> ToleranceUsed:
    """`given` if there is one, else the loosest tolerance among `dtypes`.

    A comparison is only as exact as its least precise input: a float32 cache of a bfloat16
    model still carries bfloat16 rounding.
    """
    if given is not None:
        return ToleranceUsed(given, "given")
    candidates = [(tolerance(d), str(d).removeprefix("torch.")) for d in set(dtypes)]
    if not candidates:
        return ToleranceUsed(tolerance(torch.float64), "float64")
    tol, source = max(candidates, key=lambda c: (c[0].rtol, c[0].atol))
    return ToleranceUsed(tol, source)


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """The worst element out of tolerance, and how many are."""

    index: tuple[int, ...]
    actual: float
    expected: float
    error: float
    scale: float
    bound: float
    n_bad: int
    n_total: int

    def describe(
        self,
        axes: Sequence[str],
        used: ToleranceUsed,
        scale_is: str,
        names: tuple[str, str] = ("got", "expected"),
    ) -> str:
        """Two lines: where the largest error is, and the tolerance it broke."""
        where = _where(self.index, axes)
        return (
            f"largest error {self.error:.3g} at {where}: {names[0]} {self.actual:.6g}, "
            f"{names[1]} {self.expected:.6g}\n"
            f"{used.source} tolerance: |error| <= atol {used.tol.atol:g} + rtol "
            f"{used.tol.rtol:g} x {self.scale:.3g} ({scale_is}) = {self.bound:.3g} there; "
            f"{self.n_bad} of {self.n_total} elements out of tolerance"
        )


def find_mismatch(
    actual: Tensor, expected: Tensor, scale: Tensor, tol: Tolerance, equal_nan: bool = False
) -> Mismatch | None:
    """The largest error among elements where `|actual - expected| > atol + rtol * scale`.

    NaN is never close to anything (a NaN activation is a bug, not rounding), unless
    `equal_nan` and both sides hold NaN at that element; equal infinities are equal (masked
    attention scores are `-inf` on both sides), and an infinity is far from everything
    else. A bound that is not finite (a NaN or infinite `scale`) accepts nothing.
    """
    actual, expected = torch.broadcast_tensors(actual.double(), expected.double())
    error = (actual - expected).abs()
    error = torch.where(actual == expected, 0.0, error).nan_to_num(nan=torch.inf)
    scale = scale.double().abs().expand_as(error)
    bound = tol.atol + tol.rtol * scale
    finite = actual.isfinite() & expected.isfinite()
    # Where both sides are finite, the bound decides, and a NaN or infinite bound (from a
    # NaN or an infinity among the terms of `scale`) fails; elsewhere only equality passes.
    bad = torch.where(finite, ~(error <= bound) | ~bound.isfinite(), actual != expected)
    if equal_nan:
        bad &= ~(actual.isnan() & expected.isnan())
    n_bad = int(bad.sum())
    if n_bad == 0:
        return None
    flat = torch.where(bad, error, -1.0).flatten().argmax()
    index = tuple(int(i) for i in torch.unravel_index(flat, error.shape))
    return Mismatch(
        index=index,
        actual=float(actual[index]),
        expected=float(expected[index]),
        error=float(error[index]),
        scale=float(scale[index]),
        bound=float(bound[index]),
        n_bad=n_bad,
        n_total=error.numel(),
    )


def numbered(failures: Sequence[tuple[str, str]], limit: int = 8) -> list[str]:
    """`[i] what` and its indented detail for the first `limit` failures; the rest by name."""
    lines = []
    for i, (what, detail) in enumerate(failures[:limit], 1):
        lines.append(f"[{i}] {what}")
        lines += [f"    {line}" for line in detail.splitlines()]
    if len(failures) > limit:
        rest = ", ".join(what for what, _ in failures[limit:])
        lines.append(f"... and {len(failures) - limit} more: {rest}")
    return lines


def axes_for(axes: Sequence[str], ndim: int) -> tuple[str, ...]:
    """The glossary axes of an activation as cached: without `batch` if it was removed, with
    the `head` axis of a per-head norm input; `()` when they cannot be told."""
    axes = tuple(axes)
    if len(axes) == ndim + 1 and axes[:1] == ("batch",):
        axes = axes[1:]
    if len(axes) == ndim - 1 and "pos" in axes and "head" not in axes:
        at = axes.index("pos") + 1
        axes = (*axes[:at], "head", *axes[at:])
    return axes if len(axes) == ndim else ()


def _where(index: tuple[int, ...], axes: Sequence[str]) -> str:
    if not index:
        return "the only element"
    if len(axes) == len(index):
        return ", ".join(f"{axis} {i}" for axis, i in zip(axes, index, strict=True))
    return f"index {list(index)}"
