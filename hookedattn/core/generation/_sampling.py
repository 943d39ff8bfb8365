"""Choosing the next token from the logits: greedy, or a draw after temperature, top-k and
top-p; seeded per row, so that a row draws the same tokens whatever batch it is in.

`torch.multinomial` over a batch draws every row from one generator, so a row's tokens depend
on the rows beside it. `RowSampler` gives each row its own generator, seeded by that row's
seed, and draws each token by inverting the row's cumulative distribution at one uniform
number from it: the `t`-th token of a row is a function of its seed, `t` and its own
probabilities only. (Rows run in a batch get their logits from batched products, equal to a
row run alone to rounding; a token could only differ where a uniform number falls within
that rounding of a boundary of the cumulative distribution.)
"""

import dataclasses
import math
from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How the next token is chosen from the logits.

    Greedy (the most likely token, the first on ties) unless `do_sample`; sampling divides
    the logits by `temperature` (0 means greedy), keeps the `top_k` most likely tokens,
    then the smallest set of most likely tokens whose probability reaches `top_p`.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        # `not (low <= x)` rather than `x < low`: NaN compares false with everything.
        if not _is_number(self.temperature) or not 0 <= self.temperature < math.inf:
            raise ValueError(
                f"temperature must be a number >= 0 and finite (0 is greedy), got "
                f"{self.temperature!r}"
            )
        if self.top_k is not None and (
            not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 1
        ):
            raise ValueError(f"top_k must be an int >= 1 or None, got {self.top_k!r}")
        if self.top_p is not None and not (_is_number(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] (a number) or None, got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        """Whether the next token is the argmax of the logits."""
        return not self.do_sample or self.temperature == 0


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def next_token_probs(
    logits: Float[Tensor, "batch d_vocab_out"], sampling: Sampling
) -> Float[Tensor, "batch d_vocab_out"]:
    """The distribution a sampling step draws from: temperature, then top-k, then top-p."""
    scaled = logits / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < scaled.shape[-1]:
        kth = scaled.topk(sampling.top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, -torch.inf)
    probs = scaled.softmax(dim=-1)
    if sampling.top_p is not None:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep a token when the tokens more likely than it do not yet reach top_p: the
        # smallest prefix whose mass reaches top_p, never empty.
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        keep_sorted = mass_before < sampling.top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = probs.masked_fill(~keep, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def choose_next_tokens(
    logits: Float[Tensor, "batch d_vocab_out"],
    sampling: Sampling,
    generator: torch.Generator | None = None,
) -> Int[Tensor, " batch"]:
    """The next token of each sequence: the argmax, or a draw from `next_token_probs`."""
    if sampling.greedy:
        return logits.argmax(dim=-1)
    probs = next_token_probs(logits.to(torch.float64), sampling)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


class RowSampler:
    """Draws each row's next token from that row's own generator (module docstring).

    `seeds` holds one seed per row; `RowSampler.for_batch(seed, batch)` gives every row
    the same seed (an int) or its own (a sequence). Each draw advances every row's generator
    by one number, padding rows included, so a row's `t`-th token reads its `t`-th number.
    """

    def __init__(self, seeds: Sequence[int]) -> None:
        self.generators = [torch.Generator().manual_seed(seed) for seed in seeds]

    @classmethod
    def for_batch(cls, seed: int | Sequence[int], batch: int) -> "RowSampler":
        """A sampler for `batch` rows from one seed for all or a seed per row."""
        seeds = [seed] * batch if isinstance(seed, int) else list(seed)
        if len(seeds) != batch or not all(
            isinstance(s, int) and not isinstance(s, bool) for s in seeds
        ):
            raise ValueError(f"seed must be an int or one int per row ({batch} rows), got {seed!r}")
        return cls(seeds)

    def uniforms(self) -> Float[Tensor, " batch"]:
        """One uniform number in [0, 1) per row, each from its row's generator."""
        return torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in self.generators])

    def choose(self, logits: Float[Tensor, "batch d_vocab_out"], sampling: Sampling) -> Tensor:
        """The next token of each row: the argmax, or the inverse of the row's cumulative
        distribution at its uniform number (the first token whose cumulative mass exceeds
        it, so a token of probability 0 is never drawn)."""
        if sampling.greedy:
            return logits.argmax(dim=-1)
        probs = next_token_probs(logits.to(torch.float64), sampling)
        cdf = probs.cumsum(dim=-1)
        u = self.uniforms().to(cdf.device)[:, None] * cdf[:, -1:]
        index = torch.searchsorted(cdf, u, right=True)[:, 0]
        return index.clamp(max=cdf.shape[-1] - 1)


class FrequencyPenalty:
    """The logits step of `freq_penalty`: each token's logit lowered by `penalty` times the
    number of times it occurs in its row so far (real tokens only, prompt included), after
    the temperature (TransformerLens's order: `logits / T - penalty * count`). Counts are
    kept as the rows grow, one update per step."""

    def __init__(
        self,
        penalty: float,
        sampling: Sampling,
        tokens: Int[Tensor, "batch pos"],
        mask: Int[Tensor, "batch pos"],
        d_vocab: int,
    ) -> None:
        # Choosing divides by the temperature (when it samples): the penalty goes in times it.
        scale = sampling.temperature if not sampling.greedy else 1.0
        self.step = scale * penalty
        counts = torch.zeros(tokens.shape[0], d_vocab, dtype=torch.float64, device=tokens.device)
        self.counts = counts.scatter_add_(1, tokens, mask.to(torch.float64))

    def __call__(self, logits: Float[Tensor, "batch d_vocab_out"]) -> Tensor:
        """`logits`, penalised (in float64)."""
        return logits.to(torch.float64) - self.step * self.counts

    def add(self, chosen: Int[Tensor, " batch"], real: Tensor) -> None:
        """Count each row's newly chosen token (padding after a row ended is not counted)."""
        self.counts.scatter_add_(1, chosen[:, None], real.to(torch.float64)[:, None])
