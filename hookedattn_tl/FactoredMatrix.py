"""TransformerLens's `FactoredMatrix`: ours, with TL's errors, `eigenvalues` and `Vh` warning.

The products, broadcasting and SVD are `hookedattn.core.factored_matrix.FactoredMatrix`'s
(TL's rules: leading dimensions broadcast, a product goes through the smallest inner
size). Where TL differs, this subclass is TL: a shape mistake raises what TL raises
(`AssertionError` for inner sizes and non-scalars in `*`, `RuntimeError` for leading
dimensions that do not broadcast; each is also our `ValueError`/`TypeError`), `eigenvalues`
are the `mdim` eigenvalues of `B @ A`, and `Vh` warns that it is `V`. Every result that is
a factored matrix is one of this class.

TL also multiplies by tensor-likes: objects that are not tensors but speak enough of the
protocol (`ndim`, `shape`, `unsqueeze`, `squeeze`, `broadcast_to`, `@` both ways). A
product with one absorbs it into the nearer factor (`B @ other`, `other @ A`) or, for a
vector, multiplies through both factors; the results are the tensor-like's own type, and a
factored matrix may hold tensor-like factors. Ours takes tensors only, and checks dtypes.
"""

import functools
import warnings
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

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


@runtime_checkable
class TensorLike(Protocol):
    """What TL's products need of an operand that is not a tensor (module docstring)."""

    ndim: int
    shape: Any

    def unsqueeze(self, dim: int) -> Any:
        """A new axis of size 1 at `dim` (a vector becomes a column)."""

    def squeeze(self, dim: int) -> Any:
        """The axis `dim` (of size 1) dropped."""

    def broadcast_to(self, shape: Any) -> Any:
        """A view with the leading dimensions of `shape`."""

    def __matmul__(self, other: Any) -> Any:
        """`self @ other`."""

    def __rmatmul__(self, other: Any) -> Any:
        """`other @ self`."""


def _is_tensor_like(value: Any) -> bool:
    return isinstance(value, TensorLike) and not isinstance(value, Tensor | _core.FactoredMatrix)


class FactoredMatrix(_core.FactoredMatrix):
    """`A @ B` held as its factors, with TransformerLens's conventions (see the module)."""

    @_tl_errors
    def __init__(
        self,
        A: Float[Tensor, "*leading_a ldim mdim_a"] | TensorLike,
        B: Float[Tensor, "*leading_b mdim_b rdim"] | TensorLike,
    ) -> None:
        if not (_is_tensor_like(A) or _is_tensor_like(B)):
            super().__init__(A, B)
            return
        # TL's duck-typed factors: the core's shape rules, through the protocol only.
        if A.ndim < 2 or B.ndim < 2 or A.shape[-1] != B.shape[-2]:
            raise TLAssertionError(
                f"factors must be matrices with equal inner sizes, got A {tuple(A.shape)} "
                f"and B {tuple(B.shape)}"
            )
        leading = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
        self._A = A.broadcast_to((*leading, *A.shape[-2:]))
        self._B = B.broadcast_to((*leading, *B.shape[-2:]))
        self._svd = None

    _tensor_matmul = _tl_errors(_core.FactoredMatrix.__matmul__)
    _tensor_rmatmul = _tl_errors(_core.FactoredMatrix.__rmatmul__)

    def __matmul__(self, other: Any) -> "FactoredMatrix | Tensor | TensorLike":
        """`self @ other` (the core's product; a tensor-like as the module says)."""
        if not _is_tensor_like(other):
            return self._tensor_matmul(other)
        if other.ndim == 1:
            self._check_tensor_like(self.rdim, other.shape[0], other)
            return (self.A @ (self.B @ other.unsqueeze(-1))).squeeze(-1)
        self._check_tensor_like(self.rdim, other.shape[-2], other)
        return FactoredMatrix(self.A, self.B @ other)

    def __rmatmul__(self, other: Any) -> "FactoredMatrix | Tensor | TensorLike":
        """`other @ self` (the core's product; a tensor-like as the module says)."""
        if not _is_tensor_like(other):
            return self._tensor_rmatmul(other)
        if other.ndim == 1:
            self._check_tensor_like(other.shape[0], self.ldim, other)
            return ((other.unsqueeze(0) @ self.A) @ self.B).squeeze(-2)
        self._check_tensor_like(other.shape[-1], self.ldim, other)
        return FactoredMatrix(other @ self.A, self.B)

    def _check_tensor_like(self, left: int, right: int, other: Any) -> None:
        if left != right:
            raise TLAssertionError(
                f"cannot multiply: inner sizes {left} and {right} differ (factored matrix "
                f"{list(self.shape)}, {type(other).__name__} {list(other.shape)})"
            )

    def __repr__(self) -> str:
        """TL's text, `FactoredMatrix: Shape(torch.Size([...])), Hidden Dim(mdim)` (printed by
        its demos)."""
        return f"FactoredMatrix: Shape({self.shape}), Hidden Dim({self.mdim})"

    __mul__ = _tl_errors(_core.FactoredMatrix.__mul__)
    __rmul__ = __mul__
    __truediv__ = _tl_errors(_core.FactoredMatrix.__truediv__)
    __neg__ = _tl_errors(_core.FactoredMatrix.__neg__)
    __getitem__ = _tl_errors(_core.FactoredMatrix.__getitem__)
    make_even = _tl_errors(_core.FactoredMatrix.make_even)

    @property
    def AB(self) -> Float[Tensor, "*leading ldim rdim"] | TensorLike:
        """The dense product `A @ B` (of the factors' type, for tensor-like factors)."""
        return self.A @ self.B

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


__all__ = ["SVD", "FactoredMatrix", "TensorLike"]
