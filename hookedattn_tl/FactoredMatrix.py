"""TransformerLens's `FactoredMatrix`: ours, with TL's errors, `eigenvalues` and `Vh` warning.

The products, broadcasting and SVD are `hookedattn.core.factored_matrix.FactoredMatrix`'s
(TL's rules: leading dimensions broadcast, a product goes through the smallest inner
size). Where TL differs, this subclass is TL: a shape mistake raises what TL raises
(`AssertionError` for inner sizes and non-scalars in `*`, `RuntimeError` for leading
dimensions that do not broadcast; each is also our `ValueError`/`TypeError`), `eigenvalues`
are the `mdim` eigenvalues of `B @ A`, and `Vh` warns that it is `V`. Every result that is
a factored matrix is one of this class.
"""

import functools
import warnings
from collections.abc import Callable
from typing import Any

import torch
from jaxtyping import Complex, Float
from torch import Tensor

from hookedattn.core import factored_matrix as _core
from hookedattn.core.factored_matrix import SVD
from hookedattn_tl._errors import TLAssertionError, TLRuntimeError, TLTypeAssertionError


def _tl_errors(method: Callable) -> Callable:
    """Run `method`, raising TL's error types for shape and type mistakes, and giving
    factored results as this module's class."""

    @functools.wraps(method)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            result = method(*args, **kwargs)
        except (TLAssertionError, TLRuntimeError, TLTypeAssertionError):
            raise
        except ValueError as error:
            kind = TLRuntimeError if "broadcast" in str(error) else TLAssertionError
            raise kind(f"{error} (shape mismatch)") from None
        except TypeError as error:
            raise TLTypeAssertionError(str(error)) from None
        except RuntimeError as error:  # torch's own broadcasting of leading dimensions
            raise TLRuntimeError(str(error)) from None
        return _as_tl(result)

    return wrapper


def _as_tl(value: Any) -> Any:
    if isinstance(value, _core.FactoredMatrix) and not isinstance(value, FactoredMatrix):
        return FactoredMatrix(value.A, value.B)
    return value


class FactoredMatrix(_core.FactoredMatrix):
    """`A @ B` held as its factors, with TransformerLens's conventions (see the module)."""

    @_tl_errors
    def __init__(
        self, A: Float[Tensor, "*leading_a ldim mdim_a"], B: Float[Tensor, "*leading_b mdim_b rdim"]
    ) -> None:
        super().__init__(A, B)

    def __repr__(self) -> str:
        """TL's text, `FactoredMatrix: Shape(torch.Size([...])), Hidden Dim(mdim)` (printed by
        its demos)."""
        return f"FactoredMatrix: Shape({self.shape}), Hidden Dim({self.mdim})"

    __matmul__ = _tl_errors(_core.FactoredMatrix.__matmul__)
    __rmatmul__ = _tl_errors(_core.FactoredMatrix.__rmatmul__)
    __mul__ = _tl_errors(_core.FactoredMatrix.__mul__)
    __rmul__ = __mul__
    __truediv__ = _tl_errors(_core.FactoredMatrix.__truediv__)
    __neg__ = _tl_errors(_core.FactoredMatrix.__neg__)
    __getitem__ = _tl_errors(_core.FactoredMatrix.__getitem__)
    make_even = _tl_errors(_core.FactoredMatrix.make_even)

    @property
    def T(self) -> "FactoredMatrix":
        """The transpose, `B.T @ A.T`."""
        return _as_tl(super().T)

    @property
    def BA(self) -> Float[Tensor, "*leading mdim mdim"]:
        """`B @ A`, for a square matrix (TL asserts `ldim == rdim`)."""
        if self.ldim != self.rdim:
            raise TLAssertionError(f"B @ A needs a square matrix (ldim == rdim), got {self.shape}")
        return super().BA

    @property
    def eigenvalues(self) -> Complex[Tensor, "*leading mdim"]:
        """The `mdim` eigenvalues of `B @ A` (TL's: those of `A @ B` that can be nonzero,
        with `mdim - ldim` zeros where `mdim > ldim`), for a square matrix."""
        if self.ldim != self.rdim:
            raise TLAssertionError(f"eigenvalues need a square matrix, got shape {self.shape}")
        BA = self.B @ self.A
        if BA.dtype in (torch.bfloat16, torch.float16):
            BA = BA.float()  # torch has no eig in half precision; TL computes it in float32
        return torch.linalg.eig(BA).eigenvalues

    @property
    def Vh(self) -> Float[Tensor, "*leading rdim k"]:
        """`V` (the right singular vectors as columns), with TL's DeprecationWarning."""
        warnings.warn(
            "FactoredMatrix.Vh is V (the right singular vectors as columns), not "
            "torch.linalg.svd's Vh; use FactoredMatrix.V",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.V


__all__ = ["SVD", "FactoredMatrix"]
