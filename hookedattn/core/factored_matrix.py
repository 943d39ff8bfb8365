"""`FactoredMatrix`: a product `A @ B` kept as its two factors.

The circuits of an attention head are low-rank products: `OV = W_V @ W_O` and
`QK = W_Q @ W_K.T` are `d_model x d_model` but of rank at most `d_head`, and the full OV
circuit `W_E @ OV @ W_U` is `d_vocab x d_vocab` (2.5 billion entries for GPT-2) of rank at
most `d_head`. Kept as factors `A: [... ldim mdim]` and `B: [... mdim rdim]`, every
product, norm, SVD and spectrum costs memory proportional to `(ldim + rdim) * mdim`, never
`ldim * rdim`. Leading dimensions (`[layer head ...]`) broadcast as in `torch.matmul`.

Lives in `hookedattn` (not `analysis`) because `model.QK` and `model.OV` return it;
`analysis` re-exports it.
"""

from typing import NamedTuple

import torch
from jaxtyping import Complex, Float
from torch import Tensor

# LAPACK and cuSOLVER have no 16-bit QR, SVD or eig: those run in float32.
_LINALG_UPCAST = {torch.float16: torch.float32, torch.bfloat16: torch.float32}


class SVD(NamedTuple):
    """A thin singular value decomposition: `M == U @ diag(S) @ V.mT`.

    `U: [... ldim k]` and `V: [... rdim k]` have orthonormal columns (the left and right
    singular vectors), `S: [... k]` is non-negative and descending, `k = min(ldim, mdim,
    rdim)`. `V` holds the right singular vectors as columns: it is what TransformerLens
    calls `Vh` (its `Vh` is not the conjugate transpose that `torch.linalg.svd` calls `Vh`),
    so `U, S, Vh = fm.svd()` written for TransformerLens still gets the same numbers, and
    `svd.Vh` / `fm.Vh` are aliases of `V`.
    """

    U: Float[Tensor, "*leading ldim k"]
    S: Float[Tensor, "*leading k"]
    V: Float[Tensor, "*leading rdim k"]

    @property
    def Vh(self) -> Float[Tensor, "*leading rdim k"]:
        """TransformerLens's name for `V` (the same tensor, not its transpose)."""
        return self.V

    def __repr__(self) -> str:
        return f"SVD(U={_shape(self.U)}, S={_shape(self.S)}, V={_shape(self.V)})"


class FactoredMatrix:
    """The matrix `A @ B`, held as `A: [... ldim mdim]` and `B: [... mdim rdim]`.

    `shape` is `(*leading, ldim, rdim)`; leading dimensions of `A` and `B` broadcast.
    Products with matrices and with other factored matrices stay factored, through the
    smaller inner dimension; products with vectors return tensors. `svd()`, `eigenvalues`
    and `norm()` are computed from the factors. `AB` materialises the product: use it only
    when `ldim * rdim` is small.
    """

    def __init__(
        self, A: Float[Tensor, "*leading_a ldim mdim_a"], B: Float[Tensor, "*leading_b mdim_b rdim"]
    ) -> None:
        if A.ndim < 2 or B.ndim < 2:
            raise ValueError(
                f"both factors must be matrices (ndim >= 2), got A {_shape(A)} and B {_shape(B)}"
            )
        if A.shape[-1] != B.shape[-2]:
            raise ValueError(
                f"inner dimensions differ: A {_shape(A)} has {A.shape[-1]} columns but "
                f"B {_shape(B)} has {B.shape[-2]} rows"
            )
        if A.dtype != B.dtype:
            raise TypeError(f"factors must share a dtype, got A {A.dtype} and B {B.dtype}")
        try:
            leading = torch.broadcast_shapes(A.shape[:-2], B.shape[:-2])
        except RuntimeError:
            raise ValueError(
                f"leading dimensions do not broadcast: A {_shape(A)}, B {_shape(B)}"
            ) from None
        # expand makes views, not copies: broadcasting costs no memory.
        self._A = A.expand(*leading, *A.shape[-2:])
        self._B = B.expand(*leading, *B.shape[-2:])
        self._svd: SVD | None = None

    # ------------------------------------------------------------------ shape
    A = property(lambda self: self._A, doc="Left factor `[... ldim mdim]`.")
    B = property(lambda self: self._B, doc="Right factor `[... mdim rdim]`.")
    ldim = property(lambda self: self._A.shape[-2], doc="Number of rows of `A @ B`.")
    mdim = property(lambda self: self._A.shape[-1], doc="The inner dimension of the factors.")
    rdim = property(lambda self: self._B.shape[-1], doc="Number of columns of `A @ B`.")
    dtype = property(lambda self: self._A.dtype, doc="The factors' dtype.")
    device = property(lambda self: self._A.device, doc="The factors' device.")

    @property
    def shape(self) -> torch.Size:
        """`(*leading, ldim, rdim)`: the shape of the product."""
        return torch.Size((*self._A.shape[:-1], self.rdim))

    @property
    def ndim(self) -> int:
        """Number of dimensions of the product, leading ones included."""
        return len(self.shape)

    @property
    def has_leading_dims(self) -> bool:
        """Whether there are dimensions before the matrices' own (`[layer head ...]`)."""
        return self._A.ndim > 2

    @property
    def pair(
        self,
    ) -> tuple[Float[Tensor, "*leading ldim mdim"], Float[Tensor, "*leading mdim rdim"]]:
        """The factors `(A, B)`."""
        return self._A, self._B

    def __repr__(self) -> str:
        dtype = str(self.dtype).removeprefix("torch.")
        return f"FactoredMatrix(shape={list(self.shape)}, mdim={self.mdim}, dtype={dtype})"

    # ------------------------------------------------------------------ products
    @property
    def AB(self) -> Float[Tensor, "*leading ldim rdim"]:
        """The dense product `A @ B`: `ldim x rdim` per matrix, so mind the memory."""
        return self._A @ self._B

    @property
    def BA(self) -> Float[Tensor, "*leading mdim mdim"]:
        """The reverse product `B @ A` (square matrices only); it shares AB's nonzero spectrum."""
        if self.ldim != self.rdim:
            raise ValueError(f"B @ A needs a square matrix (ldim == rdim), got shape {self.shape}")
        return self._B @ self._A

    @property
    def T(self) -> "FactoredMatrix":
        """The transpose of each matrix: `B.mT @ A.mT`."""
        return FactoredMatrix(self._B.mT, self._A.mT)

    def __matmul__(self, other: object) -> "FactoredMatrix | Tensor":
        """`self @ other`: a factored matrix, or a tensor when `other` is a vector `[rdim]`.

        A scalar (Python number or 0-d tensor) scales the matrix. A matrix
        `[... rdim n]` is absorbed into `B` (inner dimension `mdim`) or, when `rdim < mdim`,
        multiplies the collapsed product (inner dimension `rdim`): whichever keeps the
        result smaller. A factored matrix gives the product with the smallest of the inner
        sizes on offer, `min(mdim, rdim, other.mdim)`, as TransformerLens does.
        """
        if isinstance(other, FactoredMatrix):
            self._check_inner(self.rdim, other.ldim, other.shape)
            inner = min(self.mdim, self.rdim, other.mdim)
            if inner == self.mdim:
                return FactoredMatrix(self._A, (self._B @ other._A) @ other._B)
            if inner == other.mdim:
                return FactoredMatrix(self._A @ (self._B @ other._A), other._B)
            return FactoredMatrix(self.AB, other.AB)
        if _is_zero_dim_scalar(other):
            return self * other
        if not isinstance(other, Tensor):
            raise TypeError(_operand_message("@", other))
        if other.ndim == 1:
            self._check_inner(self.rdim, other.shape[0], other.shape)
            # As a column [rdim 1], so that leading dimensions broadcast as matrices do.
            return (self._A @ (self._B @ other[:, None]))[..., 0]
        self._check_inner(self.rdim, other.shape[-2], other.shape)
        if self.mdim <= self.rdim:
            return FactoredMatrix(self._A, self._B @ other)
        return FactoredMatrix(self.AB, other)

    def __rmatmul__(self, other: object) -> "FactoredMatrix | Tensor":
        """`other @ self`: a factored matrix, or a tensor when `other` is a vector `[ldim]`."""
        if _is_zero_dim_scalar(other):
            return self * other
        if not isinstance(other, Tensor):
            raise TypeError(_operand_message("@", other))
        if other.ndim == 1:
            self._check_inner(other.shape[0], self.ldim, other.shape)
            return ((other[None, :] @ self._A) @ self._B)[..., 0, :]
        self._check_inner(other.shape[-1], self.ldim, other.shape)
        if self.mdim <= self.ldim:
            return FactoredMatrix(other @ self._A, self._B)
        return FactoredMatrix(other, self.AB)

    def __mul__(self, scalar: object) -> "FactoredMatrix":
        """Scale by a Python number or a one-element tensor (for matrices use `@`)."""
        if not _is_scalar(scalar):
            raise TypeError(_operand_message("*", scalar))
        return FactoredMatrix(self._A * _as_scalar(scalar), self._B)

    __rmul__ = __mul__

    def __truediv__(self, scalar: object) -> "FactoredMatrix":
        """Divide by a Python number or a one-element tensor."""
        if not _is_scalar(scalar):
            raise TypeError(_operand_message("/", scalar))
        return FactoredMatrix(self._A / _as_scalar(scalar), self._B)

    def __neg__(self) -> "FactoredMatrix":
        return FactoredMatrix(-self._A, self._B)

    def _check_inner(self, left: int, right: int, other_shape: tuple) -> None:
        if left != right:
            raise ValueError(
                f"cannot multiply: inner sizes {left} and {right} differ "
                f"(factored matrix {list(self.shape)}, other {list(other_shape)})"
            )

    # ------------------------------------------------------------------ indexing
    def __getitem__(self, index: object) -> "FactoredMatrix":
        """Index the leading dimensions, then optionally rows and columns.

        `fm[1]`, `fm[1, 2]`, `fm[:, 3]` select matrices; one more index selects rows and two
        more select rows and columns, kept as matrices (`fm[0, 0, :5, :5]`; an int row or
        column is kept as a slice of length one). Ellipsis and None are not supported.
        """
        index = index if isinstance(index, tuple) else (index,)
        if any(i is Ellipsis or i is None for i in index):
            raise TypeError(f"FactoredMatrix indexing takes no Ellipsis or None, got {index!r}")
        n_leading = self.ndim - 2
        if len(index) > self.ndim:
            raise IndexError(f"too many indices ({len(index)}) for shape {list(self.shape)}")
        leading, matrix = index[:n_leading], tuple(_keep_axis(i) for i in index[n_leading:])
        A, B = self._A[leading], self._B[leading]
        if len(matrix) >= 1:
            A = A[..., matrix[0], :]
        if len(matrix) == 2:
            B = B[..., matrix[1]]
        return FactoredMatrix(A, B)

    # ------------------------------------------------------------------ spectra
    def svd(self) -> SVD:
        """The thin SVD of `A @ B`, from the factors: see `SVD` for the convention.

        QR-factor `A = Q_a R_a` and `B.mT = Q_b R_b`; then `A @ B = Q_a (R_a R_b^T) Q_b^T`,
        and the SVD `U_m S V_m^T` of the small `R_a R_b^T` gives `U = Q_a U_m`,
        `V = Q_b V_m`. Cost `O((ldim + rdim) mdim^2)`, memory `O((ldim + rdim) mdim)`.
        Computed once and remembered.
        """
        if self._svd is None:
            A, B = _upcast(self._A), _upcast(self._B)
            Q_a, R_a = torch.linalg.qr(A)
            Q_b, R_b = torch.linalg.qr(B.mT)
            U_m, S, Vh_m = torch.linalg.svd(R_a @ R_b.mT, full_matrices=False)
            self._svd = SVD(U=Q_a @ U_m, S=S, V=Q_b @ Vh_m.mT)
        return self._svd

    U = property(lambda self: self.svd().U, doc="Left singular vectors `[... ldim k]`.")
    S = property(lambda self: self.svd().S, doc="Singular values `[... k]`, descending.")
    V = property(lambda self: self.svd().V, doc="Right singular vectors as columns `[... rdim k]`.")

    @property
    def Vh(self) -> Float[Tensor, "*leading rdim k"]:
        """TransformerLens's name for `V`: the right singular vectors as columns.

        Not `torch.linalg.svd`'s `Vh`, which is `V` transposed: TransformerLens code reads
        `fm.Vh` as `V` (`U @ diag(S) @ Vh.T == AB`), so that is what it gets here.
        """
        return self.V

    @property
    def eigenvalues(self) -> Complex[Tensor, "*leading k"]:
        """The `k = min(ldim, mdim)` eigenvalues of a square `A @ B` that can be nonzero.

        `A @ B` and `B @ A` have the same nonzero eigenvalues (if `B A v = k v` then
        `A B (A v) = k (A v)`), so they are those of the `mdim x mdim` matrix `B @ A` when
        `mdim <= ldim` (the other `ldim - mdim` eigenvalues of `A @ B` are zero), else of
        `A @ B` itself. Complex, in no particular order.
        """
        if self.ldim != self.rdim:
            raise ValueError(f"eigenvalues need a square matrix, got shape {list(self.shape)}")
        A, B = _upcast(self._A), _upcast(self._B)
        small = B @ A if self.mdim <= self.ldim else A @ B
        return torch.linalg.eigvals(small)

    def norm(self) -> Float[Tensor, "*leading"]:
        """The Frobenius norm of each matrix, from the two `mdim x mdim` Gram matrices.

        `||A B||_F^2 = trace(B^T A^T A B) = sum((A^T A) * (B B^T))`: two matrix products,
        `O((ldim + rdim) mdim^2)`, fast even at vocabulary size. Its rounding error is
        about `eps * ||A||_F ||B||_F` on the squared norm, small next to `||A B||_F^2`
        unless the product nearly cancels (then take `S` from `svd()`, backward stable).
        """
        A, B = _upcast(self._A), _upcast(self._B)
        squared = ((A.mT @ A) * (B @ B.mT)).sum(dim=(-2, -1))
        return squared.clamp(min=0).sqrt()

    # ------------------------------------------------------------------ views
    def get_corner(self, k: int = 3) -> Float[Tensor, "*leading k_rows k_cols"]:
        """The top-left `k x k` corner of each matrix, dense (leading dimensions kept).

        TransformerLens's `get_corner` also cuts every leading dimension to `k`, which hides
        all heads past the third; here only rows and columns are cut.
        """
        return self._A[..., :k, :] @ self._B[..., :, :k]

    def collapse_l(self) -> Float[Tensor, "*leading k rdim"]:
        """`diag(S) @ V.mT`: the matrix with its orthonormal left factor `U` removed.

        Its columns have the same Gram matrix as those of `A @ B` (`U` has orthonormal
        columns), in `k` rather than `ldim` rows.
        """
        svd = self.svd()
        return svd.S[..., :, None] * svd.V.mT

    def collapse_r(self) -> Float[Tensor, "*leading ldim k"]:
        """`U @ diag(S)`: the matrix with its orthonormal right factor `V` removed."""
        svd = self.svd()
        return svd.U * svd.S[..., None, :]

    def make_even(self) -> "FactoredMatrix":
        """The same matrix as `(U sqrt(S)) @ (sqrt(S) V^T)`: balanced factors."""
        svd = self.svd()
        root = svd.S.sqrt()
        return FactoredMatrix(svd.U * root[..., None, :], root[..., :, None] * svd.V.mT)


def _is_scalar(value: object) -> bool:
    if isinstance(value, bool):
        return False
    # A one-element tensor (shape [] or [1], as TransformerLens accepts) is a scalar.
    return isinstance(value, int | float) or (isinstance(value, Tensor) and value.numel() == 1)


def _is_zero_dim_scalar(value: object) -> bool:
    # With `@`, a one-element tensor of shape [1] is a vector (of an rdim-1 matrix).
    return _is_scalar(value) and not (isinstance(value, Tensor) and value.ndim > 0)


def _as_scalar(value: int | float | Tensor) -> int | float | Tensor:
    """A one-element tensor as 0-d, so that it scales without adding dimensions."""
    return value.reshape(()) if isinstance(value, Tensor) else value


def _operand_message(op: str, other: object) -> str:
    what = (
        f"a tensor of shape {list(other.shape)}"
        if isinstance(other, Tensor)
        else type(other).__name__
    )
    if op == "@":
        return f"FactoredMatrix {op} needs a tensor, a FactoredMatrix or a scalar, got {what}"
    return (
        f"FactoredMatrix {op} needs a number or a one-element tensor (use @ for matrices), "
        f"got {what}"
    )


def _keep_axis(index: object) -> object:
    """An int row/column index as a slice of length one, so the result stays a matrix."""
    if isinstance(index, int) and not isinstance(index, bool):
        return slice(index, index + 1) if index != -1 else slice(-1, None)
    return index


def _upcast(x: Tensor) -> Tensor:
    dtype = _LINALG_UPCAST.get(x.dtype)
    return x if dtype is None else x.to(dtype)


def _shape(x: Tensor) -> list[int]:
    return list(x.shape)
