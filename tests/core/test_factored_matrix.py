"""FactoredMatrix: every operation against the dense product it stands for."""

import pytest
import torch
from torch.testing import assert_close

from hookedattn import FactoredMatrix
from hookedattn.core.tolerances import tolerance

DTYPES = [torch.float32, torch.float64]

# (A shape, B shape): no leading dims, leading dims, broadcast leading dims,
# mdim < ldim, rdim (the circuits' case) and mdim > ldim, rdim (rank-deficient by shape).
SHAPES = {
    "plain": ((7, 3), (3, 5)),
    "batched": ((2, 3, 7, 3), (2, 3, 3, 5)),
    "broadcast": ((2, 1, 6, 4), (3, 4, 6)),
    "wide_inner": ((4, 9), (9, 5)),
}


def factors(a_shape, b_shape, dtype, seed=0):
    generator = torch.Generator().manual_seed(seed)
    A = torch.randn(a_shape, generator=generator, dtype=torch.float64).to(dtype)
    B = torch.randn(b_shape, generator=generator, dtype=torch.float64).to(dtype)
    return A, B


def rank_deficient(dtype, seed=0):
    """A @ B of rank 2 although every dimension is at least 4."""
    generator = torch.Generator().manual_seed(seed)
    X = torch.randn(8, 2, generator=generator, dtype=torch.float64)
    Y = torch.randn(2, 4, generator=generator, dtype=torch.float64)
    B = torch.randn(4, 6, generator=generator, dtype=torch.float64)
    return (X @ Y).to(dtype), B.to(dtype)


def square(dtype, seed=0, batch=()):
    generator = torch.Generator().manual_seed(seed)
    A = torch.randn(*batch, 6, 3, generator=generator, dtype=torch.float64).to(dtype)
    B = torch.randn(*batch, 3, 6, generator=generator, dtype=torch.float64).to(dtype)
    return A, B


def close(actual, expected, dtype, scale=1.0):
    tol = tolerance(dtype)
    assert_close(actual, expected, rtol=tol.rtol * scale, atol=tol.atol * scale)


@pytest.fixture(params=list(SHAPES), ids=list(SHAPES))
def shapes(request):
    return SHAPES[request.param]


@pytest.fixture(params=DTYPES, ids=["float32", "float64"])
def dtype(request):
    return request.param


# ---------------------------------------------------------------- shape and products
def test_shape_ndim_and_pair(shapes, dtype):
    A, B = factors(*shapes, dtype)
    fm = FactoredMatrix(A, B)
    dense = A @ B
    assert fm.shape == dense.shape
    assert fm.ndim == dense.ndim
    assert (fm.ldim, fm.mdim, fm.rdim) == (A.shape[-2], A.shape[-1], B.shape[-1])
    left, right = fm.pair
    assert_close(left @ right, dense)


def test_AB_is_the_dense_product(shapes, dtype):
    A, B = factors(*shapes, dtype)
    assert_close(FactoredMatrix(A, B).AB, A @ B)


def test_BA_is_the_reverse_product(dtype):
    A, B = square(dtype, batch=(2,))
    assert_close(FactoredMatrix(A, B).BA, B @ A)


def test_BA_of_a_rectangular_matrix_is_refused():
    A, B = factors((7, 3), (3, 5), torch.float64)
    with pytest.raises(ValueError, match="square"):
        FactoredMatrix(A, B).BA


def test_transpose(shapes, dtype):
    A, B = factors(*shapes, dtype)
    fm = FactoredMatrix(A, B)
    assert_close(fm.T.AB, (A @ B).mT)
    assert fm.T.shape == (A @ B).mT.shape


def test_matmul_matrix(shapes, dtype):
    A, B = factors(*shapes, dtype)
    fm = FactoredMatrix(A, B)
    M = factors((fm.rdim, 2), (1, 1), dtype, seed=1)[0]
    product = fm @ M
    assert isinstance(product, FactoredMatrix)
    close(product.AB, (A @ B) @ M, dtype)
    # stays factored through the smaller of mdim and rdim
    assert product.mdim == min(fm.mdim, fm.rdim)


def test_matmul_batched_matrix(dtype):
    A, B = factors((7, 3), (3, 5), dtype)
    M = factors((4, 5, 2), (1, 1), dtype, seed=1)[0]
    close((FactoredMatrix(A, B) @ M).AB, (A @ B) @ M, dtype)


def test_rmatmul_matrix(shapes, dtype):
    A, B = factors(*shapes, dtype)
    fm = FactoredMatrix(A, B)
    M = factors((2, fm.ldim), (1, 1), dtype, seed=1)[0]
    product = M @ fm
    assert isinstance(product, FactoredMatrix)
    close(product.AB, M @ (A @ B), dtype)
    assert product.mdim == min(fm.mdim, fm.ldim)


# A vector on the right or on the left: its length, its seed, and the product.
VECTOR_PRODUCTS = {
    "matmul": (lambda fm: fm.rdim, 2, lambda matrix, v: matrix @ v),
    "rmatmul": (lambda fm: fm.ldim, 3, lambda matrix, v: v @ matrix),
}


@pytest.mark.parametrize("side", VECTOR_PRODUCTS)
def test_product_with_a_vector(shapes, dtype, side):
    length, seed, product = VECTOR_PRODUCTS[side]
    A, B = factors(*shapes, dtype)
    fm = FactoredMatrix(A, B)
    v = torch.randn(length(fm), generator=torch.Generator().manual_seed(seed)).to(dtype)
    result = product(fm, v)
    assert isinstance(result, torch.Tensor)
    close(result, product(A @ B, v), dtype)


@pytest.mark.parametrize("scalar", [2.5, -3, torch.tensor(0.5)])
def test_scalar_products(shapes, dtype, scalar):
    A, B = factors(*shapes, dtype)
    fm, dense = FactoredMatrix(A, B), A @ B
    expected = dense * scalar
    close((fm * scalar).AB, expected, dtype)
    close((scalar * fm).AB, expected, dtype)
    close((fm @ scalar).AB, expected, dtype)
    close((scalar @ fm).AB, expected, dtype)
    close((fm / scalar).AB, dense / scalar, dtype)
    close((-fm).AB, -dense, dtype)


@pytest.mark.parametrize("inner", [(2, 5), (5, 2)], ids=["left_smaller", "right_smaller"])
def test_matmul_factored(dtype, inner):
    m_1, m_2 = inner
    A_1, B_1 = factors((2, 6, m_1), (2, m_1, 7), dtype)
    A_2, B_2 = factors((2, 7, m_2), (2, m_2, 4), dtype, seed=1)
    product = FactoredMatrix(A_1, B_1) @ FactoredMatrix(A_2, B_2)
    assert isinstance(product, FactoredMatrix)
    assert product.mdim == min(inner)
    close(product.AB, (A_1 @ B_1) @ (A_2 @ B_2), dtype)


def test_mismatched_inner_sizes_are_refused():
    A, B = factors((7, 3), (3, 5), torch.float64)
    fm = FactoredMatrix(A, B)
    with pytest.raises(ValueError, match="inner"):
        fm @ torch.ones(4, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="inner"):
        torch.ones(2, 4, dtype=torch.float64) @ fm
    with pytest.raises(ValueError, match="inner"):
        fm @ fm


def test_construction_errors_name_the_problem():
    with pytest.raises(ValueError, match="inner dimensions differ"):
        FactoredMatrix(torch.ones(4, 3), torch.ones(2, 5))
    with pytest.raises(TypeError, match="dtype"):
        FactoredMatrix(torch.ones(4, 3), torch.ones(3, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="broadcast"):
        FactoredMatrix(torch.ones(2, 4, 3), torch.ones(3, 3, 5))


def test_non_scalar_multiplication_is_refused():
    fm = FactoredMatrix(*factors((4, 3), (3, 4), torch.float64))
    with pytest.raises(TypeError, match="use @"):
        fm * torch.ones(4, 4, dtype=torch.float64)


# ---------------------------------------------------------------- indexing
def test_indexing_leading_dims():
    A, B = factors((2, 3, 7, 3), (2, 3, 3, 5), torch.float64)
    fm, dense = FactoredMatrix(A, B), A @ B
    assert_close(fm[1].AB, dense[1])
    assert_close(fm[1, 2].AB, dense[1, 2])
    assert_close(fm[:, 0].AB, dense[:, 0])
    assert_close(fm[[0, 1], 1:].AB, dense[[0, 1], 1:])


def test_indexing_rows_and_columns_keeps_matrices():
    A, B = factors((2, 3, 7, 3), (2, 3, 3, 5), torch.float64)
    fm, dense = FactoredMatrix(A, B), A @ B
    assert_close(fm[0, 1, 2:5].AB, dense[0, 1, 2:5])
    assert_close(fm[0, 1, :4, 1:3].AB, dense[0, 1, :4, 1:3])
    assert_close(fm[0, 1, -1, 2].AB, dense[0, 1, -1:, 2:3])


def test_indexing_broadcast_factors():
    A, B = factors((2, 1, 6, 4), (3, 4, 6), torch.float64)
    assert_close(FactoredMatrix(A, B)[1, 2].AB, (A @ B)[1, 2])


def test_indexing_refuses_ellipsis():
    fm = FactoredMatrix(*factors((2, 7, 3), (2, 3, 5), torch.float64))
    with pytest.raises(TypeError, match="Ellipsis"):
        fm[..., 0]


# ---------------------------------------------------------------- svd and spectra
def test_svd_reconstructs(shapes, dtype):
    A, B = factors(*shapes, dtype)
    svd = FactoredMatrix(A, B).svd()
    close(svd.U @ torch.diag_embed(svd.S) @ svd.V.mT, A @ B, dtype, scale=10)


def test_svd_is_orthonormal_and_sorted(shapes, dtype):
    A, B = factors(*shapes, dtype)
    svd = FactoredMatrix(A, B).svd()
    k = svd.S.shape[-1]
    eye = torch.eye(k, dtype=dtype).expand(*svd.S.shape[:-1], k, k)
    close(svd.U.mT @ svd.U, eye, dtype, scale=10)
    close(svd.V.mT @ svd.V, eye, dtype, scale=10)
    assert (svd.S[..., :-1] >= svd.S[..., 1:]).all()
    assert k == min(A.shape[-2], A.shape[-1], B.shape[-1])


def test_singular_values_match_dense(shapes, dtype):
    A, B = factors(*shapes, dtype)
    fm = FactoredMatrix(A, B)
    dense = torch.linalg.svdvals((A @ B).double())[..., : fm.S.shape[-1]]
    close(fm.S, dense.to(dtype), dtype, scale=10)


def test_svd_of_a_rank_deficient_product(dtype):
    A, B = rank_deficient(dtype)
    fm = FactoredMatrix(A, B)
    svd = fm.svd()
    close(svd.U @ torch.diag_embed(svd.S) @ svd.V.mT, A @ B, dtype, scale=10)
    close(svd.U.mT @ svd.U, torch.eye(4, dtype=dtype), dtype, scale=10)
    assert svd.S[2:].abs().max() < 1e3 * tolerance(dtype).atol  # rank 2
    assert svd.S[1] > 0.1


def test_U_S_V_properties_and_Vh_is_V():
    fm = FactoredMatrix(*factors((7, 3), (3, 5), torch.float64))
    svd = fm.svd()
    assert_close(fm.U, svd.U)
    assert_close(fm.S, svd.S)
    assert_close(fm.V, svd.V)
    # TransformerLens's name: its Vh is V itself (not torch.linalg.svd's transpose).
    assert fm.Vh is fm.V
    assert svd.Vh is svd.V


def test_svd_unpacks_in_transformer_lens_order():
    fm = FactoredMatrix(*factors((7, 3), (3, 5), torch.float64))
    U, S, V = fm.svd()
    assert_close(U @ torch.diag(S) @ V.T, fm.AB)


def test_eigenvalues_match_dense(dtype):
    A, B = square(dtype, batch=(2,))
    ours = FactoredMatrix(A, B).eigenvalues.to(torch.complex128)
    dense = torch.linalg.eigvals((A @ B).double())  # 6 each: ours and 3 zeros
    assert ours.shape == (2, 3)
    for i in range(2):
        nearest = nearest_distinct(dense[i], ours[i])
        close(ours[i], dense[i][nearest], dtype, scale=100)
        zeros = dense[i][[j for j in range(6) if j not in nearest]]
        close(zeros, torch.zeros_like(zeros), dtype, scale=100)


def test_eigenvalues_when_mdim_exceeds_ldim():
    A, B = factors((4, 9), (9, 4), torch.float64)
    ours = FactoredMatrix(A, B).eigenvalues
    dense = torch.linalg.eigvals(A @ B)
    assert ours.shape == (4,)
    assert_close(sorted_eigenvalues(ours), sorted_eigenvalues(dense))


def test_eigenvalues_of_a_rectangular_matrix_are_refused():
    with pytest.raises(ValueError, match="square"):
        FactoredMatrix(*factors((7, 3), (3, 5), torch.float64)).eigenvalues


def test_norm_is_frobenius(shapes, dtype):
    A, B = factors(*shapes, dtype)
    close(FactoredMatrix(A, B).norm(), torch.linalg.matrix_norm(A @ B), dtype, scale=10)


def test_norm_of_a_rank_deficient_product(dtype):
    A, B = rank_deficient(dtype)
    close(FactoredMatrix(A, B).norm(), torch.linalg.matrix_norm(A @ B), dtype, scale=10)


# ---------------------------------------------------------------- views
def test_get_corner(shapes, dtype):
    A, B = factors(*shapes, dtype)
    close(FactoredMatrix(A, B).get_corner(2), (A @ B)[..., :2, :2], dtype)


def test_collapse_l_keeps_the_column_gram_matrix(shapes, dtype):
    A, B = factors(*shapes, dtype)
    dense, collapsed = A @ B, FactoredMatrix(A, B).collapse_l()
    assert collapsed.shape[-1] == dense.shape[-1]
    close(collapsed.mT @ collapsed, dense.mT @ dense, dtype, scale=100)


def test_collapse_r_keeps_the_row_gram_matrix(shapes, dtype):
    A, B = factors(*shapes, dtype)
    dense, collapsed = A @ B, FactoredMatrix(A, B).collapse_r()
    assert collapsed.shape[-2] == dense.shape[-2]
    close(collapsed @ collapsed.mT, dense @ dense.mT, dtype, scale=100)


def test_make_even_is_the_same_matrix(shapes, dtype):
    A, B = factors(*shapes, dtype)
    close(FactoredMatrix(A, B).make_even().AB, A @ B, dtype, scale=10)


def test_repr_is_short():
    fm = FactoredMatrix(*factors((2, 7, 3), (2, 3, 5), torch.float32))
    assert repr(fm) == "FactoredMatrix(shape=[2, 7, 5], mdim=3, dtype=float32)"


def test_svd_of_a_large_vocabulary_product_stays_factored():
    # The full-OV shape, scaled down: nothing of size ldim x rdim is ever built.
    A, B = factors((20_000, 4), (4, 20_000), torch.float32)
    fm = FactoredMatrix(A, B)
    svd = fm.svd()
    assert svd.U.shape == (20_000, 4) and svd.V.shape == (20_000, 4)
    assert_close(fm.norm(), svd.S.square().sum().sqrt(), rtol=1e-4, atol=0)


# ---------------------------------------------------------------- helpers
def sorted_eigenvalues(values):
    order = torch.argsort(values.real * 1e6 + values.imag)
    return values[order]


def nearest_distinct(dense, ours):
    """For each of `ours`, the index of the nearest eigenvalue in `dense`, each used once."""
    free, chosen = list(range(dense.shape[0])), []
    for value in ours:
        nearest = min(free, key=lambda j: abs(complex(dense[j]) - complex(value)))
        free.remove(nearest)
        chosen.append(nearest)
    return chosen
