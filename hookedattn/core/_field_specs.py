"""Field specs: a field's type and range or choices, and the one check that enforces them.

A table of specs (see `hookedattn.core.config.FIELD_SPECS`) gives every field the same error:
the field, the value it got, and what is allowed. Types are checked strictly where Python
is loose: `True` is not an int, `"false"` is not a bool, NaN is in no range.
"""

import dataclasses
import difflib
import math
from typing import Any

import torch


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """What one config field may hold.

    `kind` is `int`, `float` (ints accepted and converted), `bool`, `str`, `tuple` or
    `torch.dtype`. `low`/`high` bound numbers (`low_open`: strictly above `low`);
    `choices` lists the allowed values; `item_choices` the allowed items of a tuple.
    """

    kind: type
    low: int | float | None = None
    high: int | float | None = None
    low_open: bool = False
    choices: tuple | None = None
    item_choices: tuple | None = None
    optional: bool = False

    def allowed(self) -> str:
        """What this spec allows, in words, for error messages."""
        if self.choices is not None:
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        elif self.item_choices is not None:
            text = "a list of " + " / ".join(repr(c) for c in self.item_choices)
        else:
            text = {int: "an int", float: "a finite number", bool: "True or False"}.get(
                self.kind, f"a {self.kind.__name__}"
            )
            if self.low is not None:
                text += f" {'>' if self.low_open else '>='} {self.low:g}"
            if self.high is not None:
                text += f" and <= {self.high:g}"
        return text + (" (or None)" if self.optional else "")


def check_field(name: str, value: Any, specs: dict[str, FieldSpec]) -> Any:
    """`value` if it satisfies `specs[name]` (ints converted for float fields), else an error.

    A value of the wrong type is a `TypeError`, one out of range or not among the choices a
    `ValueError`; both name the field, the value and what is allowed.
    """
    spec = specs[name]
    if value is None and spec.optional:
        return None
    if not _has_kind(value, spec.kind):
        raise TypeError(f"{name} must be {spec.allowed()}, got {value!r} ({type(value).__name__})")
    if spec.kind is float:
        value = float(value)
    if spec.choices is not None and value not in spec.choices:
        raise ValueError(f"unknown {name} {value!r}: {closest(value, spec.choices)}")
    if not _in_range(value, spec):
        raise ValueError(f"{name} must be {spec.allowed()}, got {value!r}")
    return value


def closest(value: object, valid: tuple) -> str:
    """A hint naming the valid choices closest to `value`, for error messages."""
    names = [str(v) for v in valid]
    close = difflib.get_close_matches(str(value), names, n=2, cutoff=0.5)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    return f"valid values are {', '.join(repr(v) for v in valid)}{hint}"


def _has_kind(value: Any, kind: type) -> bool:
    if kind is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind is torch.dtype:
        return isinstance(value, torch.dtype)
    return isinstance(value, kind)


def _in_range(value: Any, spec: FieldSpec) -> bool:
    if spec.choices is not None:
        return value in spec.choices
    if spec.item_choices is not None:
        return all(isinstance(v, str) and v in spec.item_choices for v in value)
    if spec.kind not in (int, float):
        return True
    if not math.isfinite(value):
        return False
    above = spec.low is None or (value > spec.low if spec.low_open else value >= spec.low)
    return above and (spec.high is None or value <= spec.high)
