"""Measures of in-context learning and of the induction circuit, with the papers' thresholds.

The findings of Elhage et al. 2021 ("A Mathematical Framework for Transformer Circuits")
and Olsson et al. 2022 ("In-context Learning and Induction Heads"), each read against a
baseline. The induction report (`python scripts/induction`) shows them on the shipped
models and `tests/shipped/test_induction_findings.py` checks them, both through this module,
so that the numbers and thresholds of the report and of the tests are one.

In-context learning (ICL) is measured in one sign convention throughout: the loss with
less context minus the loss with more (first copy minus second copy of a repeated
sequence; early minus late positions of held-out text), in nats, positive when the context
helps. Olsson et al.'s "in-context learning score" is the negative of the text one.

More in `docs/guide/shipped-models.md`.
"""

import dataclasses
import itertools
import math
from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from analysis.composition import CompositionScores, composition_scores
from analysis.head_detectors import HeadScores, detect_head, induction_scores, prev_token_scores
from analysis.patching import Component, ablation_hooks, frozen_pattern_hooks
from hookedattn import ActivationCache, HookedTransformer, process_weights
from hookedattn.core import pretrained_info
from hookedattn.core.loss import lm_cross_entropy_loss
from hookedattn.training.corpus import repeated_random_tokens

# Reached as a namespace (`from analysis import induction`), as the report and its tests do.
__all__ = [
    "ABLATIONS",
    "BIGRAM_SHARE",
    "EARLY",
    "FAR_BELOW",
    "LATE",
    "MAJORITY",
    "MOST",
    "N_SEQ",
    "PERIOD",
    "SIGMAS",
    "UNIFORM_BYTE_LOSS",
    "Bigram",
    "CheckpointScores",
    "CircuitHeads",
    "RepeatLosses",
    "TextLosses",
    "ablate_heads",
    "bigram_comparison",
    "checkpoint_scores",
    "composition_floor",
    "crossing",
    "induction_without",
    "locate_circuit",
    "offset_profile",
    "order_blind_loss",
    "repeat_losses",
    "repeated_tokens",
    "steepest_rise",
    "text_losses",
]

# ---------------------------------------------------------------------- thresholds
MAJORITY = 0.5  # a head "is" a previous-token / induction head: most attention on its target
SIGMAS = 3.0  # "well above" a random baseline: more than 3 of its standard deviations
FAR_BELOW = 0.5  # "far below" the order-blind bound: under half of it
MOST = 0.5  # "most" of the in-context learning: more than half of it
BIGRAM_SHARE = 0.9  # the 0-layer model gets >= 90% of the way from unigram to bigram loss
UNIFORM_BYTE_LOSS = math.log(256)  # a model that has learnt nothing about the next byte


def composition_floor(d_model: int) -> float:
    """2/sqrt(d_model): a composition score above it is more than random overlap can give.

    Two random directions in `d_model` dimensions overlap by about 1/sqrt(d_model); the
    Monte-Carlo baseline of `composition_scores` is the sharper test, this the simple one.
    """
    return 2.0 / math.sqrt(d_model)


# ---------------------------------------------------------------------- repeated sequences
PERIOD = 63  # <bos>, then 63 random bytes, twice: 127 tokens
N_SEQ = 32


def repeated_tokens(
    seed: int = 0, period: int = PERIOD, n_seq: int = N_SEQ
) -> Int[Tensor, "batch pos"]:
    """`<bos>` and a random byte segment twice: the standard induction test."""
    generator = torch.Generator().manual_seed(seed)
    return repeated_random_tokens(n_seq, 2 * period + 1, period, generator)


@dataclasses.dataclass(frozen=True)
class RepeatLosses:
    """Loss on `<bos> + segment + segment` per prediction, and its summaries (nats)."""

    per_position: Float[Tensor, " prediction"]  # mean over sequences
    first: float  # predictions of the first copy's tokens 2..P
    second: float  # predictions of the second copy's tokens
    order_blind: float  # predicting each token by its frequency in the first copy

    @property
    def icl(self) -> float:
        """In-context learning: first-copy minus second-copy loss (positive: it helps)."""
        return self.first - self.second

    @property
    def above_uniform(self) -> bool:
        """Whether the second copy's loss exceeds ln 256: where an intact model's context
        helps, this one predicts worse than knowing nothing, so it is broken, not just blind
        to the repeat. (On the first copy, with nothing to learn from, even the intact
        models lose a little more than ln 256: they expect text, not random bytes.)"""
        return self.second > UNIFORM_BYTE_LOSS


def repeat_losses(
    logits: Float[Tensor, "batch pos d_vocab"],
    tokens: Int[Tensor, "batch pos"],
    period: int = PERIOD,
) -> RepeatLosses:
    """Summaries of the per-token loss of `logits` on repeated sequences `tokens`."""
    loss = lm_cross_entropy_loss(logits, tokens, per_token=True).mean(0)
    return RepeatLosses(
        per_position=loss.detach(),
        first=float(loss[1:period].mean()),
        second=float(loss[period:].mean()),
        order_blind=order_blind_loss(tokens, period),
    )


def order_blind_loss(tokens: Int[Tensor, "batch pos"], period: int) -> float:
    """Loss of predicting each second-copy token with its frequency in the first copy.

    The best a model can do with the context when it knows which tokens occurred but not
    in what order (a one-layer model's copying heads, Elhage et al. 2021): the bound that
    only an order-aware mechanism such as induction can beat.
    """
    segments = tokens[:, 1 : period + 1]
    counts = torch.zeros(tokens.shape[0], int(tokens.max()) + 1).scatter_add_(
        1, segments, torch.ones_like(segments, dtype=torch.float)
    )
    frequency = counts.gather(1, segments) / period
    return float(-frequency.log().mean())


# ---------------------------------------------------------------------- the circuit's heads
@dataclasses.dataclass(frozen=True)
class CircuitHeads:
    """The two heads of a two-layer induction circuit, and the scores that pick them.

    `induction_head` (layer 1) has the highest induction score; `prev_head` (layer 0) is
    its strongest K-composition partner. The scores are read on `tokens`.
    """

    induction_head: int
    prev_head: int
    prev_scores: HeadScores
    induction: HeadScores
    composition: dict[str, CompositionScores]  # "Q", "K", "V"

    def composition_of_pair(self, kind: str) -> float:
        """The `kind`-composition score of the pair, prev head into induction head."""
        return float(self.composition[kind].scores[0, self.prev_head, 1, self.induction_head])

    def k_partners(self) -> tuple[int, ...]:
        """Layer-0 heads whose K-composition into the induction head is well above random."""
        k = self.composition["K"]
        scores = k.scores[0, :, 1, self.induction_head]
        return tuple(int(i) for i in (scores > k.threshold(SIGMAS)).nonzero())

    def induction_heads(self) -> tuple[int, ...]:
        """Every layer-1 head with a majority of its attention on the induction target."""
        scores = self.induction.scores[1]
        return tuple(h for h in range(len(scores)) if scores[h] > MAJORITY)


def locate_circuit(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], cache: ActivationCache
) -> CircuitHeads:
    """Find the induction head and its K-composition partner in a two-layer model.

    `cache` holds the attention patterns of `model` on `tokens`. Composition is read from
    the processed weights (norms folded), where the weights are the circuit.
    """
    induction = induction_scores(model, cache=cache, tokens=tokens)
    processed = process_weights(model)
    composition = {kind: composition_scores(processed, kind) for kind in "QKV"}
    head = int(induction.scores[1].argmax())
    partner = int(composition["K"].scores[0, :, 1, head].argmax())
    return CircuitHeads(head, partner, prev_token_scores(model, cache), induction, composition)


def offset_profile(
    model: HookedTransformer,
    cache: ActivationCache,
    tokens: Int[Tensor, "batch pos"],
    head: int,
    n_offsets: int = 5,
) -> tuple[float, ...]:
    """Mean attention of layer-0 `head` to the token `k` back, for k = 0 .. n_offsets - 1."""

    def target(k: int):
        def offset(tokens: Tensor) -> Tensor:
            batch, n = tokens.shape
            return torch.ones(n - k).diag(-k).expand(batch, n, n)

        offset.__name__ = f"{k} back"
        return offset

    return tuple(detect_head(model, target(k), cache, tokens)[0, head] for k in range(n_offsets))


def induction_without(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], heads: Sequence[int], head: int
) -> float:
    """Layer-1 `head`'s induction score when layer-0 `heads` write nothing (zero ablation).

    Every later pattern is recomputed: pattern-preserving ablation would freeze the
    induction head's pattern, hiding exactly what K-composition does.
    """
    components = [Component("z", 0, head=h) for h in heads]
    with torch.no_grad(), model.hooks(fwd_hooks=ablation_hooks(model, components, "zero")):
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: "pattern" in n)
    return induction_scores(model, cache=cache, tokens=tokens)[1, head]


ABLATIONS = ("zero", "mean")


def ablate_heads(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    heads: Sequence[tuple[int, int]],
    period: int = PERIOD,
    *,
    method: str = "zero",
    reference: Int[Tensor, "batch pos"] | None = None,
    clean: ActivationCache | None = None,
) -> RepeatLosses:
    """Repeat losses with `(layer, head)` pairs ablated, every attention pattern kept.

    `"zero"` sets the heads' outputs to 0 (Olsson et al.'s pattern-preserving ablation);
    `"mean"`, the control, to their mean over the unrelated `reference` batch, position by
    position: what the heads write on every sequence stays, only what is specific to this
    one goes. A second-copy loss above ln 256 (`RepeatLosses.above_uniform`) means the
    ablation broke the model rather than removing one ability. `clean`, a cache of the
    patterns on `tokens`, saves recomputing them for each call.
    """
    if method not in ABLATIONS:
        raise ValueError(f"method must be one of {ABLATIONS}, got {method!r}")
    if clean is None:
        with torch.no_grad():
            _, clean = model.run_with_cache(tokens, names_filter=lambda n: "pattern" in n)
    components = [Component("z", layer, head=h) for layer, h in heads]
    hooks = frozen_pattern_hooks(model, clean)
    hooks += ablation_hooks(model, components, method, reference=reference)
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        return repeat_losses(model(tokens), tokens, period)


# ---------------------------------------------------------------------- held-out text
EARLY = slice(8, 24)  # predictions of tokens 9..24: little context yet
LATE = slice(96, 127)  # predictions of tokens 97..127: nearly the whole context


@dataclasses.dataclass(frozen=True)
class TextLosses:
    """Per-position held-out loss of a model, and its in-context learning on text."""

    per_position: Float[Tensor, " prediction"]
    mean: float  # over every prediction of every window (tokens 2..n_ctx)
    icl: float  # early minus late loss (positive: the context helps)
    icl_stderr: float  # standard error of that difference over the windows


def text_losses(model: HookedTransformer, windows: Int[Tensor, "batch pos"]) -> TextLosses:
    """Loss per position on held-out windows, and early-minus-late with its error."""
    with torch.no_grad():  # in chunks: small batches stay in the CPU's caches
        chunks = windows.split(64)
        loss = torch.cat([model(c, return_type="loss", loss_per_token=True) for c in chunks])
    difference = loss[:, EARLY].mean(1) - loss[:, LATE].mean(1)
    return TextLosses(
        per_position=loss.mean(0),
        mean=float(loss.mean()),
        icl=float(difference.mean()),
        icl_stderr=float(difference.std() / len(difference) ** 0.5),
    )


@dataclasses.dataclass(frozen=True)
class Bigram:
    """A model's held-out loss beside the corpus's unigram and bigram losses.

    All three are on the same predictions: each byte after the first of a window (the
    prediction right after `<bos>` has no previous byte for a bigram table to use).
    """

    model_loss: float
    bigram_loss: float  # bigram model of the train split (add-0.1)
    unigram_loss: float

    @property
    def share(self) -> float:
        """How much of the unigram-to-bigram gain the model gets (1 = all of it)."""
        return (self.unigram_loss - self.model_loss) / (self.unigram_loss - self.bigram_loss)


def bigram_comparison(
    model: HookedTransformer, train: Int[Tensor, " byte"], windows: Int[Tensor, "batch pos"]
) -> Bigram:
    """Cross-entropies on the byte-to-byte predictions of `windows` (after `<bos>`)."""
    counts = torch.zeros(256, 256, dtype=torch.float64)
    counts.index_put_(
        (train[:-1], train[1:]), torch.ones(len(train) - 1, dtype=torch.float64), accumulate=True
    )
    bigram = (counts + 0.1).log() - (counts + 0.1).sum(1, keepdim=True).log()
    unigram = (counts.sum(0) + 0.1).log() - (counts.sum() + 25.6).log()
    previous, following = windows[:, 1:-1].flatten(), windows[:, 2:].flatten()
    with torch.no_grad():
        loss = model(windows, return_type="loss", loss_per_token=True)[:, 1:]
    return Bigram(
        model_loss=float(loss.mean()),
        bigram_loss=float(-bigram[previous, following].mean()),
        unigram_loss=float(-unigram[following].mean()),
    )


# ---------------------------------------------------------------------- over training
@dataclasses.dataclass(frozen=True)
class CheckpointScores:
    """Induction and in-context learning on repeated sequences at each training checkpoint
    of a shipped model: the two curves whose rises Olsson et al. 2022 compare."""

    steps: tuple[int, ...]
    induction: tuple[float, ...]  # the best layer-1 induction score
    icl: tuple[float, ...]  # first-copy minus second-copy loss


def checkpoint_scores(
    name: str, tokens: Int[Tensor, "batch pos"], period: int = PERIOD
) -> CheckpointScores:
    """The scores of every checkpoint of the shipped model `name` on repeated `tokens`."""
    steps = pretrained_info(name).checkpoints
    induction, icl = [], []
    for step in steps:
        model = HookedTransformer.from_pretrained(name, checkpoint_value=step)
        with torch.no_grad():
            logits, cache = model.run_with_cache(tokens, names_filter=lambda n: "pattern" in n)
        induction.append(float(induction_scores(model, cache=cache, tokens=tokens).scores[1].max()))
        icl.append(repeat_losses(logits, tokens, period).icl)
    return CheckpointScores(tuple(steps), tuple(induction), tuple(icl))


def steepest_rise(steps: Sequence[int], values: Sequence[float]) -> tuple[int, int]:
    """The two consecutive steps between which `values` rises the most."""
    rises = [b - a for a, b in itertools.pairwise(values)]
    i = max(range(len(rises)), key=rises.__getitem__)
    return steps[i], steps[i + 1]


def crossing(steps: Sequence[int], values: Sequence[float], fraction: float) -> int:
    """The first step where `values` has covered `fraction` of its rise to its maximum."""
    low, high = values[0], max(values)
    level = low + fraction * (high - low)
    return next(s for s, v in zip(steps, values, strict=True) if v >= level)
