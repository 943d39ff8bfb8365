"""FactoredMatrix with TransformerLens's conventions: compact products, scalars, `Vh`."""

import pytest
import torch
from einops import repeat
from torch.testing import assert_close

from hookedattn_tl import FactoredMatrix


def randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


# (A ldim x mdim, B mdim x rdim) for each factor: cases where each inner size is smallest.
CASES = {
    "left_mdim_smallest": ((6, 2), (2, 5), (5, 4), (4, 3)),
    "right_mdim_smallest": ((6, 4), (4, 5), (5, 2), (2, 3)),
    "shared_rdim_smallest": ((6, 5), (5, 2), (2, 5), (5, 3)),
    "all_ones": ((1, 1), (1, 1), (1, 1), (1, 1)),
}


@pytest.mark.parametrize("shapes", CASES.values(), ids=CASES.keys())
@pytest.mark.parametrize("leading", [(), (2,), (3, 2)])
def test_product_of_factored_matrices_uses_the_smallest_inner_size(shapes, leading):
    a, b, c, d = (randn(*leading, *s, seed=i) for i, s in enumerate(shapes))
    left, right = FactoredMatrix(a, b), FactoredMatrix(c, d)
    product = left @ right
    assert_close(product.AB, (a @ b) @ (c @ d))
    assert product.mdim == min(left.mdim, left.rdim, right.ldim, right.mdim)
    assert product.shape == (*leading, left.ldim, right.rdim)


def test_has_leading_dims():
    assert not FactoredMatrix(randn(3, 2), randn(2, 4)).has_leading_dims
    A = repeat(randn(3, 2), "l m -> b l m", b=2)
    assert FactoredMatrix(A, randn(2, 4)).has_leading_dims
    assert FactoredMatrix(randn(3, 2), randn(5, 2, 4)).has_leading_dims


@pytest.mark.parametrize("scalar", [torch.tensor([2.5]), torch.tensor([[2.5]]), torch.tensor(2.5)])
def test_one_element_tensors_are_scalars(scalar):
    a, b = randn(3, 2), randn(2, 4)
    fm = FactoredMatrix(a, b)
    assert_close((fm * scalar.double()).AB, a @ b * 2.5)
    assert_close((scalar.double() * fm).AB, a @ b * 2.5)
    assert_close((fm / scalar.double()).AB, a @ b / 2.5)
    assert (fm * scalar.double()).shape == fm.shape
    with pytest.raises(TypeError, match="one-element tensor"):
        fm * torch.ones(2, dtype=torch.float64)


def test_a_shape_one_tensor_is_a_vector_for_matmul():
    a, b = randn(3, 2), randn(2, 1)
    fm = FactoredMatrix(a, b)
    assert_close(fm @ torch.tensor([2.0], dtype=torch.float64), (a @ b)[:, 0] * 2)


def test_vh_is_tl_s_right_singular_vectors():
    a, b = randn(2, 6, 3), randn(2, 3, 5, seed=1)
    fm = FactoredMatrix(a, b)
    U, S, Vh = fm.svd()  # TransformerLens's unpacking and naming
    assert_close(U @ torch.diag_embed(S) @ Vh.mT, a @ b)
    assert fm.Vh is fm.V


class _Wrapped:
    """A tensor-like: speaks the protocol TL's products use, and is no tensor."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    ndim = property(lambda self: self.tensor.ndim)
    shape = property(lambda self: self.tensor.shape)

    def unsqueeze(self, dim: int) -> "_Wrapped":
        return _Wrapped(self.tensor.unsqueeze(dim))

    def squeeze(self, dim: int) -> "_Wrapped":
        return _Wrapped(self.tensor.squeeze(dim))

    def broadcast_to(self, shape: tuple) -> "_Wrapped":
        return _Wrapped(self.tensor.broadcast_to(shape))

    def __matmul__(self, other: object) -> "_Wrapped":
        if isinstance(other, FactoredMatrix):
            return NotImplemented
        return _Wrapped(self.tensor @ getattr(other, "tensor", other))

    def __rmatmul__(self, other: object) -> "_Wrapped":
        return _Wrapped(getattr(other, "tensor", other) @ self.tensor)


def test_product_with_a_tensor_like_matrix_is_factored_and_keeps_its_type():
    a, b, m = randn(2, 3), randn(3, 4, seed=1), randn(4, 5, seed=2)
    product = FactoredMatrix(a, b) @ _Wrapped(m)
    assert isinstance(product, FactoredMatrix)
    assert isinstance(product.AB, _Wrapped)
    assert_close(product.AB.tensor, a @ b @ m)


def test_tensor_like_matrix_times_a_factored_matrix_is_factored():
    a, b, m = randn(3, 4), randn(4, 6, seed=1), randn(5, 3, seed=2)
    product = _Wrapped(m) @ FactoredMatrix(a, b)
    assert isinstance(product, FactoredMatrix)
    assert_close(product.AB.tensor, m @ a @ b)


def test_product_with_tensor_like_vectors_is_a_tensor_like_vector():
    a, b = randn(2, 3), randn(3, 4, seed=1)
    right, left = randn(4, seed=2), randn(2, seed=3)
    assert_close((FactoredMatrix(a, b) @ _Wrapped(right)).tensor, a @ b @ right)
    assert_close(FactoredMatrix(a, b).__rmatmul__(_Wrapped(left)).tensor, left @ a @ b)


def test_product_with_a_tensor_like_of_the_wrong_size_names_both_shapes():
    with pytest.raises(AssertionError, match=r"inner sizes 4 and 5 differ.*_Wrapped \[5, 2\]"):
        FactoredMatrix(randn(2, 3), randn(3, 4)) @ _Wrapped(randn(5, 2))
