"""What scores of the weights share: the same score of random weights as their baseline.

Composition and copying scores (`analysis.composition`, `analysis.copying`) read a model's
weights alone. Each is judged against the same score of Gaussian weights of the model's
shapes, drawn by a seeded Monte Carlo through Bartlett factors of Wishart matrices
(`wishart_factor`), so that a draw costs `d_head`-sized products whatever `d_model` and
`d_vocab` are.
"""

import dataclasses
from collections.abc import Callable
from typing import ClassVar

import torch
from jaxtyping import Bool, Float
from torch import Tensor


@dataclasses.dataclass(frozen=True)
class ScoresAgainstRandom:
    """Scores of a model's weights, beside the mean and spread of random weights' scores.

    `baseline` is the mean score of Gaussian weights of the model's shapes and
    `baseline_std` its standard deviation, both over `n_samples` seeded draws: a score
    several `baseline_std` above `baseline` is one that random weights would not show.
    """

    scores: Float[Tensor, "*index"]
    baseline: float
    baseline_std: float
    n_samples: int
    _label: ClassVar[str]  # the field that says which score this is, first in the repr

    def threshold(self, sigmas: float) -> float:
        """The score `sigmas` random standard deviations above the random mean."""
        return self.baseline + sigmas * self.baseline_std

    def above_random(self, sigmas: float) -> Bool[Tensor, "*index"]:
        """Where a score is above `threshold(sigmas)`."""
        return self.scores > self.threshold(sigmas)

    def __repr__(self) -> str:
        shape = " ".join(str(n) for n in self.scores.shape)
        scored = self.scores[~self.scores.isnan()]  # NaN: a hybrid's mixers, a zero spectrum
        best = float(scored.max()) if scored.numel() else float("nan")
        return (
            f"{type(self).__name__}({self._label}={getattr(self, self._label)!r}, "
            f"scores=[{shape}], max={best:.4f}, "
            f"baseline={self.baseline:.4f}±{self.baseline_std:.4f})"
        )


def seeded_draws(
    draw: Callable[[int], Float[Tensor, " sample"]], n_samples: int, chunk: int, seed: int
) -> Float[Tensor, " sample"]:
    """`n_samples` scores of random weights, `draw(n)` giving `n` of them, `chunk` at a time.

    At least two, for a spread. The draws come from a private RNG state seeded by `seed`:
    the global torch RNG is left as it was, and the same arguments give the same scores.
    """
    if n_samples < 2:
        raise ValueError(f"n_samples must be >= 2 to estimate a spread, got {n_samples}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        starts = range(0, n_samples, chunk)
        return torch.cat([draw(min(chunk, n_samples - start)) for start in starts])


def wishart_factor(n_dof: int, dim: int, n_samples: int) -> Float[Tensor, "sample rows dim"]:
    """`T` with `T^T T` distributed as `Z^T Z` for a Gaussian `Z: [n_dof dim]`.

    For `n_dof >= dim`, Bartlett's decomposition: upper triangular, `T_ii^2 ~
    chi^2(n_dof - i)` (0-based `i`) and standard normal entries above the diagonal; it is
    the `R` of the QR decomposition `Z = O R`, independent of the Haar-distributed `O`.
    For `n_dof < dim`, `Z` itself (it is then the smaller of the two).
    """
    if n_dof < dim:
        return torch.randn(n_samples, n_dof, dim, dtype=torch.float64)
    dof = torch.arange(n_dof, n_dof - dim, -1, dtype=torch.float64)
    diagonal = torch.distributions.Chi2(dof).sample((n_samples,)).sqrt()
    upper = torch.randn(n_samples, dim, dim, dtype=torch.float64).triu(1)
    return upper + torch.diag_embed(diagonal)


def upcast(x: Tensor) -> Tensor:
    """`x` in float32 where it is 16-bit: QR and eig have no 16-bit kernels."""
    return x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
