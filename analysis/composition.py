"""Composition scores between heads (Elhage et al. 2021, "Analyzing a Two-Layer Model").

An earlier head writes `x @ OV_1` into the residual stream; a later head can read that
write with its queries, its keys or its values. In the paper's column-vector notation
(`W_OV = W_O W_V`, `W_QK = W_Q^T W_K`, scores `x_q^T W_QK x_k`) the three compositions are

    Q-composition   ||W_QK^2T W_OV^1||_F / (||W_QK^2T||_F ||W_OV^1||_F)
    K-composition   ||W_QK^2  W_OV^1||_F / (||W_QK^2||_F  ||W_OV^1||_F)
    V-composition   ||W_OV^2  W_OV^1||_F / (||W_OV^2||_F  ||W_OV^1||_F)

In this package's row-vector notation (`OV = W_V @ W_O`, `QK = W_Q @ W_K.T`, scores
`x_q @ QK @ x_k.T`) the products are the transposes, with the same norms:

    Q: OV_1 @ QK_2     (head 1's output as head 2's query: (y OV_1) QK_2 x_k^T)
    K: OV_1 @ QK_2.T   (head 1's output as head 2's key:   x_q QK_2 (y OV_1)^T)
    V: OV_1 @ OV_2     (head 1's output as head 2's value: (y OV_1) OV_2)

These are also TransformerLens's `all_composition_scores`. Each is computed from the
factors, `OV_1 = A_1 B_1` and the later matrix `A_2 B_2`: with `A_1 = Q_1 R_1` and
`B_2^T = Q_2 R_2` (QR), `||A_1 B_1 A_2 B_2||_F = ||R_1 B_1 A_2 R_2^T||_F`, a
`d_head x d_head` matrix per pair of heads, never a `d_model x d_model` one. Biases and norms
are not part of the circuits: run `hookedattn.process_weights` first so that the norms'
gains are in the weights.

Grouped-query attention needs nothing more: every score is per query head (`W_K`, `W_V`
repeat each key/value head for its group). Q- and K-composition read a QK circuit, which a
model with q/k norms (`use_qk_norm`) does not have: they are refused by name for it;
V-composition is computed. A norm after the attention (`ln1_post`) cannot be folded into
the weights, so on such models every score leaves out its gain.
"""

import dataclasses
import functools
from typing import TYPE_CHECKING

import torch
from einops import einsum
from jaxtyping import Float
from torch import Tensor

from analysis._weight_scores import ScoresAgainstRandom, seeded_draws, upcast, wishart_factor
from hookedattn.core import require_bilinear_scores

if TYPE_CHECKING:
    from hookedattn.core.model import HookedTransformer

KINDS: tuple[str, ...] = ("Q", "K", "V")


@dataclasses.dataclass(frozen=True, repr=False)
class CompositionScores(ScoresAgainstRandom):
    """Scores `[layer head layer head]`: entry `[l1, h1, l2, h2]` is how much head `(l2, h2)`
    reads (through `kind`) what head `(l1, h1)` writes; zero unless `l1 < l2`, NaN where
    either is a hybrid's block without heads.

    `baseline` is the mean score of random matrices of the same shapes and `baseline_std`
    its standard deviation (seeded Monte Carlo, `n_samples` draws, see
    `composition_scores`): scores several `baseline_std` above `baseline` are compositions
    that random weights would not show.
    """

    scores: Float[Tensor, "layer head layer head"]
    kind: str
    _label = "kind"


def composition_scores(
    model: "HookedTransformer", kind: str, *, n_samples: int = 256, seed: int = 0
) -> CompositionScores:
    """Q-, K- or V-composition of every earlier head with every later head (module doc).

    The baseline is a seeded Monte-Carlo estimate, not an analytic one: for random
    Gaussian `W_V, W_O, W_Q, W_K` of this model's shapes the mean *square* score is exactly
    `1 / d_model` (the product of two independently rotated matrices), but the mean score,
    and its spread, which is what tells a significant score from noise, depend on
    `d_head` and have no simple closed form. The three kinds share one baseline (their
    random matrices have the same distribution), drawn once per shape, seed and
    `n_samples` and then memoised. `seed` seeds a private RNG state: the global torch RNG
    is left as it was.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be 'Q', 'K' or 'V', got {kind!r}")
    if kind in ("Q", "K"):
        require_bilinear_scores(model, f"{kind}-composition")
    model.cfg.require_one_attention_shape(f"{kind}-composition scores")
    mean, std = _random_baseline(model.cfg.d_model, model.cfg.d_head, n_samples, seed)
    layers = model.cfg.attention_layers  # a hybrid's blocks with heads
    with torch.no_grad():  # scores of the weights, not a graph through them
        weights = {
            name: upcast(model.stacked(name, layers)) for name in ("W_Q", "W_K", "W_V", "W_O")
        }
        written = _written(weights["W_V"], weights["W_O"])
        read = _read(*_later_factors(weights, kind))
    written_norm, read_norm = _norm(written), _norm(read)
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    scores = written.new_zeros(n_layers, n_heads, n_layers, n_heads)
    without = [layer for layer in range(n_layers) if layer not in layers]
    scores[without], scores[:, :, without] = torch.nan, torch.nan  # a hybrid's mixers
    for i, layer in enumerate(layers[:-1]):
        # One matrix product per earlier layer: every head of it against every later head.
        overlap = einsum(
            written[i],
            read[i + 1 :],
            "head r_1 d_model, layer_2 head_2 d_model r_2 -> head layer_2 head_2 r_1 r_2",
        )
        denominator = written_norm[i][:, None, None] * read_norm[i + 1 :]
        scores[layer][:, layers[i + 1 :]] = _norm(overlap) / denominator
    return CompositionScores(scores.to(model.W_E.dtype), mean, std, n_samples, kind)


def _later_factors(
    weights: dict[str, Tensor], kind: str
) -> tuple[Float[Tensor, "layer head d_model d_head"], Float[Tensor, "layer head d_head d_model"]]:
    """Factors `A_2, B_2` of the later head's matrix: QK, QK.T or OV."""
    if kind == "Q":
        return weights["W_Q"], weights["W_K"].mT
    if kind == "K":
        return weights["W_K"], weights["W_Q"].mT
    return weights["W_V"], weights["W_O"]


def _written(
    A: Float[Tensor, "*lead d_model d_head"], B: Float[Tensor, "*lead d_head d_model"]
) -> Float[Tensor, "*lead r d_model"]:
    """`R B` with `A = Q R` (QR): `||A B X||_F = ||R B X||_F` for every `X`."""
    return torch.linalg.qr(A, mode="r").R @ B


def _read(
    A: Float[Tensor, "*lead d_model d_head"], B: Float[Tensor, "*lead d_head d_model"]
) -> Float[Tensor, "*lead d_model r"]:
    """`A R^T` with `B^T = Q R` (QR): `||X A B||_F = ||X A R^T||_F` for every `X`."""
    return A @ torch.linalg.qr(B.mT, mode="r").R.mT


def _norm(x: Tensor) -> Tensor:
    return torch.linalg.matrix_norm(x)


@functools.lru_cache(maxsize=64)
def _random_baseline(d_model: int, d_head: int, n_samples: int, seed: int) -> tuple[float, float]:
    """Mean and standard deviation of the score of independent Gaussian factors.

    A function of the shapes, the seed and the sample count only, so it is memoised: the
    Q, K and V scores of a model (or of several models of one shape) draw it once.
    """
    chunk = max(1, _CHUNK_ELEMENTS // (8 * d_head * d_head))
    draw = functools.partial(_random_scores, d_model, d_head)
    scores = seeded_draws(draw, n_samples, chunk, seed)
    return float(scores.mean()), float(scores.std())


_CHUNK_ELEMENTS = 2**23  # draws at a time: a few [d_head d_head] float64 matrices each


def _random_scores(d_model: int, d_head: int, n: int) -> Float[Tensor, " sample"]:
    """Scores of `n` draws of Gaussian `A_1, B_1, A_2, B_2`, from `d_head`-sized matrices.

    The score `||A_1 B_1 A_2 B_2|| / (||A_1 B_1|| ||A_2 B_2||)` reads `A_1` only through
    `A_1^T A_1` and `B_2` only through `B_2 B_2^T` (as in `_written`, `_read`), so Wishart
    factors `T_1, T_2` stand in for them (`analysis._weight_scores.wishart_factor`). With `A_2
    = Q T_a` (QR), `B_1 [Q Q_perp] = [G H]` has independent Gaussian blocks, since the
    rows of `B_1` are isotropic: `B_1 A_2 = G T_a`, `||T_1 B_1||^2 = ||T_1 G||^2 + ||T_1
    H||^2`, where `H` enters through `H H^T` (a Wishart factor `T_h`), and `||A_2 T_2^T||
    = ||T_a T_2^T||`. The same distribution as the dense draws (a test checks it), at the
    cost of a few `d_head x d_head` products instead of `d_model`-sized QRs.
    """
    T_1, T_2, T_a = (wishart_factor(d_model, d_head, n) for _ in range(3))
    rank = T_a.shape[-2]  # min(d_model, d_head): the columns of Q
    G = torch.randn(n, d_head, rank, dtype=torch.float64)
    T_h = wishart_factor(d_model - rank, d_head, n)
    overlap = _norm(T_1 @ G @ T_a @ T_2.mT)
    written = (_norm(T_1 @ G) ** 2 + _norm(T_1 @ T_h.mT) ** 2).sqrt()
    read = _norm(T_a @ T_2.mT)
    return overlap / (written * read)
