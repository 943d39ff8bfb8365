"""`assert_close_cache`: two caches agree, activation by activation.

Two runs that should be the same (a patched run with a no-op patch, a KV-cached run and a
full one, a saved and reloaded model) differ, when they do, first at one activation and
then at everything downstream of it; the message leads with that first one.
"""

from collections.abc import Callable, Mapping, Sequence

from torch import Tensor

from hookedattn.core import names as _names
from hookedattn.core.tolerances import Tolerance
from hookedattn.testing._compare import axes_for, find_mismatch, loosest_tolerance, numbered

Names = str | tuple | Sequence[str | tuple] | Callable[[str], bool] | None


def assert_close_cache(
    cache_a: Mapping[str, Tensor],
    cache_b: Mapping[str, Tensor],
    names: Names = None,
    *,
    tol: Tolerance | None = None,
    equal_nan: bool = False,
) -> None:
    """Assert that `cache_a` and `cache_b` hold the same activations, to tolerance.

    `names`: None (every name in either cache), one key, a list of keys (full names or
    shorthand such as `("pattern", 0)`), or a predicate on full names. `cache_b` is the
    reference: the tolerance (the loosest of the two dtypes', unless `tol` is given) is
    relative to its values. A name missing from either cache, a shape that differs, or a
    value out of tolerance fails, with the name, the largest error, where it is and the
    bound; the earliest difference in forward order is named first. A NaN on either
    side fails, unless `equal_nan=True` and both caches hold NaN at that element.
    """
    for which, cache in (("cache_a", cache_a), ("cache_b", cache_b)):
        if not isinstance(cache, Mapping):
            raise TypeError(f"{which} must be an ActivationCache, got {type(cache).__name__}")
    selected = _select(cache_a, cache_b, names)
    if not selected:
        raise ValueError(
            f"no activations to compare: names={names!r} selects none of {_some(cache_a)}"
        )
    failures, missing = [], {"cache_a": [], "cache_b": []}
    for name in selected:
        absent = [
            which for which, c in (("cache_a", cache_a), ("cache_b", cache_b)) if name not in c
        ]
        for which in absent:
            missing[which].append(name)
        if absent:
            continue
        a, b = cache_a[name], cache_b[name]
        if a.shape != b.shape:
            failures.append(
                (name, f"shapes differ: {tuple(a.shape)} in cache_a, {tuple(b.shape)} in cache_b")
            )
            continue
        used = loosest_tolerance({a.dtype, b.dtype}, tol)
        mismatch = find_mismatch(a.to(b.device), b, b, used.tol, equal_nan)
        if mismatch is not None:
            axes = axes_for(_names.axis_names(name), a.ndim)
            failures.append((name, mismatch.describe(axes, used, "|cache_b|", _SIDES)))
    if failures or any(missing.values()):
        raise AssertionError(_message(failures, missing, len(selected)))


_SIDES = ("cache_a", "cache_b")


def _select(cache_a: Mapping, cache_b: Mapping, names: Names) -> list[str]:
    """Full names to compare, in cache_a's order (the forward's), then cache_b's extras."""
    every = list(cache_a) + [n for n in cache_b if n not in cache_a]
    if names is None:
        return every
    if callable(names):
        return [n for n in every if names(n)]
    keys = [names] if isinstance(names, str | tuple) else list(names)
    n_layers = getattr(cache_a, "n_layers", None) or getattr(cache_b, "n_layers", 0)
    full = [
        k if isinstance(k, str) and k in every else _names.expand_key(k, n_layers) for k in keys
    ]
    return list(dict.fromkeys(full))


def _message(failures: list[tuple[str, str]], missing: dict[str, list[str]], n: int) -> str:
    lines = []
    if failures:
        header = f"{len(failures)} of {n} activations differ between cache_a and cache_b"
        if len(failures) > 1:
            header += (
                f"; the earliest in forward order is {failures[0][0]} (the later ones may "
                f"only be its consequences)"
            )
        lines += [header + ":", *numbered(failures)]
    for which, names in missing.items():
        if names:
            lines.append(f"missing from {which}: {', '.join(names)}")
    return "\n".join(lines)


def _some(cache: Mapping) -> str:
    names = list(cache)
    return f"[{', '.join(names[:4])}{', ...' if len(names) > 4 else ''}]"
