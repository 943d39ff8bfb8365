"""Copying and eigenvalue scores (Elhage et al. 2021, "Detecting Copying Behavior").

A head copies when attending to a token raises the logit of that same token: its full OV
circuit `W_E @ OV @ W_U` (source token x output logit) then has mostly positive
eigenvalues. The paper's summary of the spectrum is

    score = sum(eigenvalues) / sum(|eigenvalues|)    in [-1, 1]

1 for a head whose full circuit is positive (the identity on token space), -1 for minus
the identity. The same summary of the full QK circuit `W_E @ QK @ W_E.T` says whether a
query token attends to keys of the same token (positive) or avoids them (negative).

The full circuits are `d_vocab x d_vocab`, but a product `A @ B` and `B @ A` share their
nonzero eigenvalues, so the score is computed from a `d_head x d_head` matrix per head:

    OV: (W_O W_U)(W_E W_V) = W_O (W_U W_E) W_V
    QK: (W_K^T W_E^T)(W_E W_Q) = W_K^T (W_E^T W_E) W_Q

`W_U W_E` (or `W_E^T W_E`) is `d_model x d_model` and computed once. As in the paper (and
TransformerLens), biases and norms are not part of the circuit: run
`hookedattn.process_weights` first to put the norms' gains and centring into the
weights (the norms' scale, a positive number, does not change the score).

With grouped-query attention the scores are per query head. The QK score needs a QK
circuit, which a model with q/k norms (`use_qk_norm`) does not have: refused by name.
"""

import dataclasses
import functools
from typing import TYPE_CHECKING

import torch
from einops import einsum
from jaxtyping import Float
from torch import Tensor

from analysis._weight_scores import ScoresAgainstRandom, seeded_draws, upcast, wishart_factor
from analysis._widths import require_stream_embeddings
from hookedattn.core import require_bilinear_scores

if TYPE_CHECKING:
    from hookedattn.core.model import HookedTransformer


@dataclasses.dataclass(frozen=True, repr=False)
class CopyingScores(ScoresAgainstRandom):
    """Per-head `sum(eigenvalues) / sum(|eigenvalues|)` of a full circuit, `[layer head]`.

    `baseline` is the expected score of random matrices of the same shapes, exactly 0
    (negating `W_O`, or `W_K`, negates the score and leaves the distribution unchanged);
    `baseline_std` is its standard deviation over `n_samples` seeded draws, the scale on
    which a score is large. A head whose spectrum is all zero scores NaN, as does every
    "head" of a hybrid's block without heads.
    """

    scores: Float[Tensor, "layer head"]
    circuit: str
    _label = "circuit"


def copying_scores(
    model: "HookedTransformer", circuit: str = "OV", *, n_samples: int = 128, seed: int = 0
) -> CopyingScores:
    """The copying score of every head's full OV circuit, or the same score of its full QK.

    The baseline spread is a seeded Monte-Carlo estimate over Gaussian `W_E, W_U, W_V,
    W_O` (`W_Q, W_K`) of this model's shapes. Each draw is sampled exactly, but through
    `d_head`-sized matrices only (Bartlett factors of Wishart matrices stand in for the
    `d_vocab`- and `d_model`-sized Gaussians; see `_random_scores`), so it costs
    `O(d_head^3)` whatever the vocabulary. `seed` seeds a private RNG state: the global
    torch RNG is left as it was.
    """
    if circuit not in ("OV", "QK"):
        raise ValueError(f"circuit must be 'OV' or 'QK', got {circuit!r}")
    if circuit == "QK":
        require_bilinear_scores(model, "copying_scores(circuit='QK')")
    if circuit == "OV" and model.cfg.d_vocab != model.cfg.d_vocab_out:
        raise ValueError(
            f"the full OV circuit is square only when d_vocab == d_vocab_out; this model has "
            f"d_vocab={model.cfg.d_vocab}, d_vocab_out={model.cfg.d_vocab_out}"
        )
    model.cfg.require_one_attention_shape("copying_scores")
    std = _random_std(
        circuit, model.cfg.d_vocab, model.cfg.d_model, model.cfg.d_head, n_samples, seed
    )
    layers = model.cfg.attention_layers  # a hybrid's blocks with heads; the others NaN
    with torch.no_grad():  # scores of the weights, not a graph through them
        found = _eigenvalue_score(_small_matrices(model, circuit, layers))
        scores = found.new_full((model.cfg.n_layers, model.cfg.n_heads), torch.nan)
        scores[layers] = found
        scores = scores.to(model.W_E.dtype)
    return CopyingScores(scores, 0.0, std, n_samples, circuit)


def _small_matrices(
    model: "HookedTransformer", circuit: str, layers: list[int]
) -> Float[Tensor, "layer head d_head d_head"]:
    """`B @ A` of each head's full circuit `A @ B` (of the blocks `layers`): same nonzero
    spectrum, `d_head` square."""
    require_stream_embeddings(model, f"the copying score of the {circuit} circuit", True)
    W_E = upcast(model.W_E)
    if circuit == "OV":
        middle = upcast(model.W_U) @ W_E
        left, right = upcast(model.stacked("W_O", layers)), upcast(model.stacked("W_V", layers))
    else:
        middle = W_E.mT @ W_E
        left = upcast(model.stacked("W_K", layers)).mT
        right = upcast(model.stacked("W_Q", layers))
    return einsum(
        left,
        middle,
        right,
        "layer head d_head_l d_model_l, d_model_l d_model_r, layer head d_model_r d_head_r "
        "-> layer head d_head_l d_head_r",
    )


def _eigenvalue_score(small: Float[Tensor, "*batch n n"]) -> Float[Tensor, "*batch"]:
    """`sum(eig) / sum(|eig|)`; the numerator is the trace, which is real and exact."""
    eigenvalues = torch.linalg.eigvals(small)
    return small.diagonal(dim1=-2, dim2=-1).sum(-1) / eigenvalues.abs().sum(-1)


def _random_std(
    circuit: str, d_vocab: int, d_model: int, d_head: int, n_samples: int, seed: int
) -> float:
    """Standard deviation of the score over random Gaussian weights of these shapes."""
    draw = functools.partial(_random_scores, circuit, d_vocab, d_model, d_head)
    return float(seeded_draws(draw, n_samples, _CHUNK, seed).std())


def _random_scores(
    circuit: str, d_vocab: int, d_model: int, d_head: int, n: int
) -> Float[Tensor, " sample"]:
    """Scores of `n` heads with Gaussian weights, through `d_head`-sized matrices only.

    Write `F(n, k)` for a factor `C` with `C^T C ~ Z^T Z`, `Z` a Gaussian `[n k]`
    (`wishart_factor`). Given `W_V`, the rows of `W_E W_V` are Gaussian with covariance
    `W_V^T W_V = C_v^T C_v`, so `W_E W_V ~ Z_e C_v`; likewise `W_O W_U ~ C_o^T Z_u`; and
    `Z_u Z_e ~ G T` with `G` Gaussian and `T = F(d_vocab, .)` (QR of `Z_e`, then `Z_u Q` is
    Gaussian). So `W_O W_U W_E W_V ~ C_o^T G T C_v`. For QK, `[W_E W_K, W_E W_Q] ~ Z C`
    with `C = F(d_model, 2 d_head)`, and `(W_E W_K)^T (W_E W_Q) ~ (T C_K)^T (T C_Q)`.
    """
    gaussian = lambda *shape: torch.randn(n, *shape, dtype=torch.float64)
    if circuit == "OV":
        C_o = wishart_factor(d_model, d_head, n)  # W_O W_O^T = C_o^T C_o
        C_v = wishart_factor(d_model, d_head, n)  # W_V^T W_V = C_v^T C_v
        T = wishart_factor(d_vocab, C_v.shape[-2], n)  # Z_e = Q T
        small = C_o.mT @ gaussian(C_o.shape[-2], T.shape[-2]) @ T @ C_v
    else:
        C = wishart_factor(d_model, 2 * d_head, n)  # [W_K W_Q]^T [W_K W_Q] = C^T C
        T = wishart_factor(d_vocab, C.shape[-2], n)  # Z = Q T
        keys, queries = (T @ C).split(d_head, dim=-1)
        small = keys.mT @ queries
    return _eigenvalue_score(small)


_CHUNK = 4096  # draws at a time: a few [d_head d_head] matrices each
