"""`assert_decomposes`: the components of a decomposition sum to what they decompose.

Exactness is the point of a decomposition (the residual stream is a sum of what every
component wrote), so a decomposition that does not sum to its target at the dtype's
tolerance is missing a term, counting one twice, or has one with the wrong sign; the
failure message says which of these the remainder looks like.
"""

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from jaxtyping import Float
from torch import Tensor

from hookedattn.core.tolerances import Tolerance
from hookedattn.testing._compare import Mismatch, ToleranceUsed, find_mismatch, loosest_tolerance

_N_LARGEST = 4


@runtime_checkable
class DecompositionLike(Protocol):
    """Anything with `.components` `[component ...]` and one of `.labels` per component."""

    components: Tensor
    labels: Sequence[str]


def assert_decomposes(
    components: Float[Tensor, "component ..."] | DecompositionLike,
    target: Float[Tensor, "..."],
    labels: Sequence[str] | None = None,
    *,
    axes: str | None = None,
    tol: Tolerance | None = None,
    equal_nan: bool = False,
) -> None:
    """Assert that `components.sum(0) == target` at the tolerance of their dtypes.

    `components` is a tensor `[component ...]` (with `labels`, one per component), or any
    object with `.components` and `.labels` (such as `analysis.Decomposition`). `axes`
    names the target's axes for the message (`"batch pos d_model"`, the default for a
    Decomposition's `[component batch pos d_model]` stack); `tol` overrides the
    dtype's tolerance, which applies relative to the sum of the components' magnitudes.
    The `AssertionError` gives the largest error and its index, the components largest
    there, and whether the remainder looks like a missing bias, a component counted twice
    or one with the wrong sign. A NaN in the sum or the target fails, unless
    `equal_nan=True` and both hold NaN at that element.
    """
    axis_names = _axis_names(components, axes)
    stacked, labels = _unpack(components, labels)
    _check_shapes(stacked, target, axis_names)
    used = loosest_tolerance({stacked.dtype, target.dtype}, tol)
    parts = stacked.detach().double()
    total, scale, expected = parts.sum(dim=0), parts.abs().sum(dim=0), target.detach().double()
    mismatch = find_mismatch(total, expected, scale, used.tol, equal_nan)
    if mismatch is None:
        return
    lines = [
        f"the {len(labels)} components do not sum to the target:",
        mismatch.describe(axis_names, used, "sum of the components' magnitudes", _SIDES),
        _largest_at(parts, labels, mismatch),
        *_diagnoses(parts, labels, expected - total, scale, used),
    ]
    raise AssertionError("\n".join(line for line in lines if line))


_SIDES = ("sum of components", "target")


def _axis_names(components: object, axes: str | None) -> tuple[str, ...]:
    # A Decomposition's stack is [component batch pos d_model].
    is_stream = isinstance(components, DecompositionLike) and components.components.ndim == 4
    if axes is None and is_stream:
        return ("batch", "pos", "d_model")
    return tuple(axes.split()) if axes else ()


def _check_shapes(stacked: Tensor, target: object, axis_names: tuple[str, ...]) -> None:
    if not isinstance(target, Tensor):
        raise TypeError(f"target must be a tensor, got {type(target).__name__}")
    if stacked.shape[1:] != target.shape:
        raise ValueError(
            f"components of shape {tuple(stacked.shape)} are [component ...] with "
            f"... = {tuple(stacked.shape[1:])}, but the target has shape {tuple(target.shape)}"
        )
    if axis_names and len(axis_names) != target.ndim:
        axes = " ".join(axis_names)
        raise ValueError(f"axes {axes!r} name {len(axis_names)} axes; the target has {target.ndim}")


def _unpack(components: object, labels: Sequence[str] | None) -> tuple[Tensor, list[str]]:
    if not isinstance(components, Tensor) and hasattr(components, "components"):
        if labels is not None:
            raise TypeError(
                f"labels come from the {type(components).__name__}; do not pass them too"
            )
        labels = getattr(components, "labels", None)
        components = components.components
    if not isinstance(components, Tensor) or components.ndim == 0:
        got = type(components).__name__
        raise TypeError(
            f"components must be a tensor [component ...] or an object with .components "
            f"and .labels (a Decomposition), got {got}"
        )
    n = components.shape[0]
    if labels is None:
        return components, [f"component {i}" for i in range(n)]
    labels = list(labels)
    if len(labels) != n:
        raise ValueError(f"{len(labels)} labels for {n} components; give one label per component")
    return components, [str(label) for label in labels]


def _largest_at(parts: Tensor, labels: list[str], mismatch: Mismatch) -> str:
    values = parts[(slice(None), *mismatch.index)]
    order = values.abs().argsort(descending=True)[:_N_LARGEST].tolist()
    shown = ", ".join(f"{labels[i]!r} {float(values[i]):.4g}" for i in order)
    more = f" (and {len(labels) - len(order)} more)" if len(labels) > len(order) else ""
    return f"largest components there: {shown}{more}" if order else ""


def _diagnoses(
    parts: Tensor, labels: list[str], remainder: Tensor, scale: Tensor, used: ToleranceUsed
) -> list[str]:
    """What the remainder `target - sum` looks like, when it looks like something."""
    bound = used.tol.atol + used.tol.rtol * scale
    close = lambda x: bool(((x - remainder).abs() <= bound).all())
    found = []
    for label, part in zip(labels, parts, strict=True):
        if not bool(part.abs().gt(bound).any()):
            continue
        if close(-part):
            found.append(f"the remainder is minus {label!r}: is it counted twice?")
        elif close(-2 * part):
            found.append(f"the remainder is minus twice {label!r}: does it have the wrong sign?")
    if remainder.ndim >= 2 and remainder.shape[:-1].numel() > 1:
        first = remainder.reshape(-1, remainder.shape[-1])[0]
        if close(first.expand_as(remainder)):
            found.append(
                "the remainder is the same vector at every index of the leading axes: a "
                "constant term (a bias such as b_O, b_out or b_U) is missing?"
            )
    return found
