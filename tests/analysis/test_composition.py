"""Composition and copying scores against brute-force dense computations."""

import math
from functools import partial

import pytest
import torch
from torch.testing import assert_close

from analysis import CompositionScores, CopyingScores, composition_scores, copying_scores
from analysis._weight_scores import wishart_factor
from analysis.composition import _random_baseline
from analysis.composition import _random_scores as _random_composition_scores
from analysis.copying import _random_scores
from hookedattn.core.tolerances import tolerance
from hookedattn.testing import tiny_model

F64 = tolerance(torch.float64).as_kwargs()


make_model = partial(
    tiny_model, n_layers=3, n_heads=2, d_head=4, n_ctx=8, d_vocab=24, attn_only=True
)


# ---------------------------------------------------------------- composition
def dense_composition(model, kind):
    """Every pair, one dense d_model x d_model product at a time."""
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    scores = torch.zeros(n_layers, n_heads, n_layers, n_heads, dtype=torch.float64)
    for l1 in range(n_layers):
        for h1 in range(n_heads):
            OV_1 = model.W_V[l1, h1] @ model.W_O[l1, h1]
            for l2 in range(l1 + 1, n_layers):
                for h2 in range(n_heads):
                    QK_2 = model.W_Q[l2, h2] @ model.W_K[l2, h2].T
                    OV_2 = model.W_V[l2, h2] @ model.W_O[l2, h2]
                    later = {"Q": QK_2, "K": QK_2.T, "V": OV_2}[kind]
                    norm = torch.linalg.matrix_norm
                    scores[l1, h1, l2, h2] = norm(OV_1 @ later) / (norm(OV_1) * norm(later))
    return scores


@pytest.mark.parametrize("kind", ["Q", "K", "V"])
@pytest.mark.parametrize("attn_only", [True, False])
def test_composition_matches_dense(kind, attn_only):
    model = make_model(attn_only=attn_only, d_mlp=32)
    result = composition_scores(model, kind)
    assert isinstance(result, CompositionScores)
    assert result.scores.shape == (3, 2, 3, 2)
    assert_close(result.scores, dense_composition(model, kind).detach(), **F64)


def test_the_paper_formulas_in_column_vector_notation():
    # Elhage et al.: Q uses W_QK^T W_OV, K uses W_QK W_OV, V uses W_OV2 W_OV1, with
    # W_OV = W_O W_V and W_QK = W_Q^T W_K for column-vector weights (ours transposed).
    model = make_model(n_layers=2)
    W_OV_1 = (model.W_V[0, 1] @ model.W_O[0, 1]).T
    W_QK_2 = model.W_Q[1, 0] @ model.W_K[1, 0].T
    W_OV_2 = (model.W_V[1, 0] @ model.W_O[1, 0]).T
    norm = torch.linalg.matrix_norm
    paper = {
        "Q": norm(W_QK_2.T @ W_OV_1) / (norm(W_QK_2) * norm(W_OV_1)),
        "K": norm(W_QK_2 @ W_OV_1) / (norm(W_QK_2) * norm(W_OV_1)),
        "V": norm(W_OV_2 @ W_OV_1) / (norm(W_OV_2) * norm(W_OV_1)),
    }
    for kind, expected in paper.items():
        assert_close(composition_scores(model, kind).scores[0, 1, 1, 0], expected.detach(), **F64)


def test_q_and_k_composition_differ():
    model = make_model()
    q, k = composition_scores(model, "Q").scores, composition_scores(model, "K").scores
    assert (q - k).abs().max() > 1e-3


def test_composition_is_zero_unless_the_first_head_is_earlier():
    scores = composition_scores(make_model(), "V").scores
    for l1 in range(3):
        for l2 in range(3):
            block = scores[l1, :, l2, :]
            assert (block > 0).all() if l1 < l2 else (block == 0).all()


def test_composition_in_float32_matches_float64():
    scores_32 = composition_scores(make_model(dtype=torch.float32), "K").scores
    scores_64 = composition_scores(make_model(dtype=torch.float64), "K").scores
    assert scores_32.dtype == torch.float32
    assert_close(scores_32.double(), scores_64, **tolerance(torch.float32).as_kwargs())


def test_composition_baseline_is_seeded_and_leaves_the_global_rng_alone():
    model = make_model()
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = composition_scores(model, "Q")
    assert torch.equal(torch.get_rng_state(), state)
    again = composition_scores(model, "Q")
    other_seed = composition_scores(model, "Q", seed=1)
    assert (first.baseline, first.baseline_std) == (again.baseline, again.baseline_std)
    assert first.baseline != other_seed.baseline


def test_composition_baseline_mean_square_is_one_over_d_model():
    # For independently rotated random matrices E[score^2] = 1 / d_model exactly.
    d_model, n = 16, 4096
    result = composition_scores(make_model(d_model=d_model), "V", n_samples=n)
    mean_square = result.baseline**2 + result.baseline_std**2 * (n - 1) / n
    standard_error = 4 * result.baseline * result.baseline_std / math.sqrt(n)
    assert abs(mean_square - 1 / d_model) < 4 * standard_error


def dense_random_scores(d_model, d_head, n, generator):
    """Scores of Gaussian factors through the dense `d_model x d_model` products."""
    A_1, B_1, A_2, B_2 = (
        torch.randn(n, *shape, generator=generator, dtype=torch.float64)
        for shape in [(d_model, d_head), (d_head, d_model)] * 2
    )
    first, second = A_1 @ B_1, A_2 @ B_2
    norm = torch.linalg.matrix_norm
    return norm(first @ second) / (norm(first) * norm(second))


@pytest.mark.parametrize("d_model, d_head", [(12, 4), (6, 4), (3, 4)])
def test_composition_baseline_draws_match_dense_gaussian_factors(d_model, d_head):
    # The baseline draws d_head-sized stand-ins; their scores must have the distribution
    # of scores of dense Gaussian factors (first and second moments, within 5 errors).
    n = 20_000
    dense = dense_random_scores(d_model, d_head, n, torch.Generator().manual_seed(0))
    torch.manual_seed(1)
    small = _random_composition_scores(d_model, d_head, n)
    for moment in (1, 2):
        a, b = dense**moment, small**moment
        error = math.sqrt(a.var() / n + b.var() / n)
        assert abs(a.mean() - b.mean()) < 5 * error, (moment, a.mean(), b.mean())


def test_composition_baseline_is_drawn_once_for_q_k_and_v():
    _random_baseline.cache_clear()
    model = make_model()
    state = torch.get_rng_state()
    results = [composition_scores(model, kind) for kind in ("Q", "K", "V")]
    assert _random_baseline.cache_info().misses == 1
    assert torch.equal(torch.get_rng_state(), state)
    assert len({(r.baseline, r.baseline_std) for r in results}) == 1


def test_composition_arguments_are_checked():
    model = make_model()
    with pytest.raises(ValueError, match="'Q', 'K' or 'V'"):
        composition_scores(model, "O")
    with pytest.raises(ValueError, match="n_samples"):
        composition_scores(model, "Q", n_samples=1)


def test_composition_repr_is_short():
    text = repr(composition_scores(make_model(), "K"))
    assert text.startswith("CompositionScores(kind='K', scores=[3 2 3 2], max=")
    assert "baseline=" in text and "\n" not in text


# ---------------------------------------------------------------- copying
def dense_eigenvalue_scores(full_circuits):
    """sum(eig) / sum(|eig|) of each dense full circuit, `[layer head]`."""
    eigenvalues = torch.linalg.eigvals(full_circuits)
    return eigenvalues.sum(-1).real / eigenvalues.abs().sum(-1)


def test_copying_scores_match_dense_eigenvalues_of_the_full_ov_circuit():
    model = make_model()
    full = model.W_E @ model.W_V @ model.W_O @ model.W_U  # [layer head d_vocab d_vocab]
    result = copying_scores(model)
    assert isinstance(result, CopyingScores)
    assert result.scores.shape == (3, 2)
    assert_close(result.scores, dense_eigenvalue_scores(full.detach()), **F64)


def test_qk_eigenvalue_scores_match_dense_eigenvalues_of_the_full_qk_circuit():
    model = make_model()
    full = model.W_E @ model.W_Q @ model.W_K.mT @ model.W_E.T
    result = copying_scores(model, "QK")
    assert_close(result.scores, dense_eigenvalue_scores(full.detach()), **F64)


def test_copying_scores_with_a_vocabulary_smaller_than_d_head():
    model = make_model(d_vocab=3)
    full = model.W_E @ model.W_V @ model.W_O @ model.W_U
    assert_close(copying_scores(model).scores, dense_eigenvalue_scores(full.detach()), **F64)


def identity_head_model(sign):
    """Layer 0 head 0: W_E OV W_U = sign * identity on token space (d_vocab = d_model)."""
    model = make_model(n_layers=1, d_model=6, d_head=6, d_vocab=6)
    generator = torch.Generator().manual_seed(0)
    W_E = torch.randn(6, 6, generator=generator, dtype=torch.float64) + 3 * torch.eye(6)
    W_V = torch.randn(6, 6, generator=generator, dtype=torch.float64) + 3 * torch.eye(6)
    with torch.no_grad():
        model.embed.W_E.copy_(W_E)
        model.unembed.W_U.copy_(torch.linalg.inv(W_E))
        model.blocks[0].attn.W_V[0].copy_(W_V)
        model.blocks[0].attn.W_O[0].copy_(sign * torch.linalg.inv(W_V))
    assert_close(
        model.W_E @ model.OV[0, 0].AB @ model.W_U, sign * torch.eye(6, dtype=torch.float64)
    )
    return model


@pytest.mark.parametrize("sign", [1, -1])
def test_identity_head_has_copying_score_plus_or_minus_one(sign):
    scores = copying_scores(identity_head_model(sign)).scores
    assert_close(scores[0, 0], torch.tensor(float(sign), dtype=torch.float64), **F64)


def test_projection_head_copies():
    # d_vocab > d_model: W_E has orthonormal columns, W_U = W_E^T, OV = identity:
    # the full OV circuit is the projection onto the span of the embedding, score 1.
    model = make_model(n_layers=1, d_model=6, d_head=6, d_vocab=20)
    W_E = torch.linalg.qr(torch.randn(20, 6, dtype=torch.float64)).Q
    with torch.no_grad():
        model.embed.W_E.copy_(W_E)
        model.unembed.W_U.copy_(W_E.T)
        model.blocks[0].attn.W_V[1].copy_(torch.eye(6))
        model.blocks[0].attn.W_O[1].copy_(torch.eye(6))
    assert_close(copying_scores(model).scores[0, 1], torch.tensor(1.0, dtype=torch.float64))


def test_copying_baseline_is_zero_with_a_seeded_spread():
    model = make_model()
    torch.manual_seed(7)
    state = torch.get_rng_state()
    first = copying_scores(model)
    assert torch.equal(torch.get_rng_state(), state)
    assert first.baseline == 0.0
    assert 0 < first.baseline_std < 1
    assert first.baseline_std == copying_scores(model).baseline_std


def test_wishart_factor_has_the_wishart_mean():
    # E[T^T T] = n_dof * I, for the Bartlett factor and for the small-n Gaussian case.
    torch.manual_seed(0)
    for n_dof, dim in [(40, 5), (3, 5)]:
        T = wishart_factor(n_dof, dim, 20_000)
        mean = (T.mT @ T).mean(0)
        assert_close(mean, n_dof * torch.eye(dim, dtype=torch.float64), rtol=0, atol=0.1 * n_dof)


@pytest.mark.parametrize("circuit", ["OV", "QK"])
def test_random_scores_are_distributed_as_for_dense_gaussian_weights(circuit):
    # The cheap sampler (through the Wishart factor) against Gaussian matrices of the
    # real shapes. Shapes where the embedding matters: a sampler that replaced W_U W_E by
    # a multiple of the identity would be off by about 0.05 in both statistics.
    d_vocab, d_model, d_head, n = 12, 8, 4, 4000
    torch.manual_seed(0)
    cheap = _random_scores(circuit, d_vocab, d_model, d_head, n)
    W_E = torch.randn(n, d_vocab, d_model, dtype=torch.float64)
    a, b = torch.randn(2, n, d_model, d_head, dtype=torch.float64)
    if circuit == "OV":
        W_U = torch.randn(n, d_model, d_vocab, dtype=torch.float64)
        full = W_E @ a @ b.mT @ W_U
    else:
        full = W_E @ a @ b.mT @ W_E.mT
    dense = dense_eigenvalue_scores(full)
    # Both means are 0 by symmetry; spreads agree within ~3 standard errors (~0.006 each).
    assert abs(cheap.mean()) < 0.05 and abs(dense.mean()) < 0.05
    assert abs(cheap.var() - dense.var()) < 0.02
    assert abs(cheap.abs().mean() - dense.abs().mean()) < 0.02


def test_copying_arguments_are_checked():
    with pytest.raises(ValueError, match="'OV' or 'QK'"):
        copying_scores(make_model(), "VO")
    with pytest.raises(ValueError, match="d_vocab_out"):
        copying_scores(make_model(d_vocab_out=30))


def test_copying_scores_in_float32_match_float64():
    scores_32 = copying_scores(make_model(dtype=torch.float32)).scores
    scores_64 = copying_scores(make_model(dtype=torch.float64)).scores
    assert scores_32.dtype == torch.float32
    assert_close(scores_32.double(), scores_64, rtol=1e-4, atol=1e-4)
