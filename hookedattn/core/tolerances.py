"""Tolerances by dtype, in one place: for the library's checks, its tests, and users' tests.

`atol` bounds an absolute error for quantities of order one (activations, logits); `rtol`
the relative error. float64 is where exactness is checked: a decomposition that does not
sum to within 1e-10 there is wrong, not imprecise.
"""

import dataclasses

import torch

# Reached as a namespace (`hookedattn.tolerances.tolerance`); `hookedattn.testing` re-exports it.
__all__ = ["TOLERANCES", "Tolerance", "tolerance"]


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """Relative and absolute tolerance, as `torch.testing.assert_close` takes them."""

    rtol: float
    atol: float

    def as_kwargs(self) -> dict[str, float]:
        """`{"rtol": ..., "atol": ...}` for `torch.testing.assert_close` or `torch.allclose`."""
        return {"rtol": self.rtol, "atol": self.atol}


TOLERANCES: dict[torch.dtype, Tolerance] = {
    torch.float64: Tolerance(rtol=1e-10, atol=1e-10),
    torch.float32: Tolerance(rtol=1e-5, atol=1e-5),
    torch.bfloat16: Tolerance(rtol=2e-2, atol=2e-2),
    torch.float16: Tolerance(rtol=2e-3, atol=2e-3),
}


def tolerance(dtype: torch.dtype) -> Tolerance:
    """The tolerance for comparing tensors of `dtype`; a `KeyError` names the known dtypes."""
    try:
        return TOLERANCES[dtype]
    except KeyError:
        known = ", ".join(str(d).removeprefix("torch.") for d in TOLERANCES)
        raise KeyError(f"no tolerance for {dtype}; known dtypes: {known}") from None
