"""Measurements behind the induction-circuit report (`scripts/induction_circuit.py`).

Each function measures one finding on the shipped models and returns a small frozen
dataclass; the report script turns them into findings, figures and text.
"""

import dataclasses
import itertools

import torch
from torch import Tensor

from analysis import (
    composition_scores,
    copying_scores,
    decompose_resid,
    detect_head,
    direct_logit_attribution,
    induction_scores,
    pattern_preserving_ablation,
    prev_token_scores,
)
from hookedattn import HookedTransformer, process_weights
from hookedattn.corpus import repeated_random_tokens
from hookedattn.loss import lm_cross_entropy_loss
from hookedattn.names import get_act_name
from hookedattn.pretrained import pretrained_info
from hookedattn.weights_io import read_config

MAJORITY = 0.5  # a head "is" a previous-token / induction head: most attention on its target
SIGMAS = 3.0  # "well above" a random baseline: more than 3 of its standard deviations
PERIOD = 63  # repeated random sequences: <bos>, then 63 random bytes, twice (127 tokens)
N_SEQ = 32


@dataclasses.dataclass(frozen=True)
class RepeatLosses:
    """Per-prediction loss on `<bos> + segment + segment`, and its summaries (nats)."""

    per_position: Tensor  # [pos-1], mean over sequences
    first: float  # predictions of the first copy's tokens 2..P
    second: float  # predictions of the second copy's tokens
    order_blind: float  # predicting each token by its frequency in the first copy

    @property
    def icl(self) -> float:
        """How much lower the second copy's loss is than the first's."""
        return self.first - self.second


def repeat_losses(logits: Tensor, tokens: Tensor, period: int = PERIOD) -> RepeatLosses:
    """Summaries of the per-token loss of `logits` on repeated sequences `tokens`."""
    loss = lm_cross_entropy_loss(logits, tokens, per_token=True).mean(0)
    return RepeatLosses(
        per_position=loss.detach(),
        first=float(loss[1:period].mean()),
        second=float(loss[period:].mean()),
        order_blind=order_blind_loss(tokens, period),
    )


def order_blind_loss(tokens: Tensor, period: int = PERIOD) -> float:
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


def repeated_tokens(seed: int = 0, period: int = PERIOD, n_seq: int = N_SEQ) -> Tensor:
    """`<bos>` and a random byte segment twice: the standard induction test."""
    return repeated_random_tokens(
        n_seq, 2 * period + 1, period, torch.Generator().manual_seed(seed)
    )


# ---------------------------------------------------------------------- the circuit
@dataclasses.dataclass(frozen=True)
class Circuit:
    """The two heads of the induction circuit and every measurement about them."""

    induction_head: int  # in layer 1
    prev_head: int  # in layer 0: the induction head's strongest K-composition partner
    prev_scores: object  # HeadScores
    induction: object  # HeadScores
    copying: object  # CopyingScores
    composition: dict  # kind -> CompositionScores
    clean: RepeatLosses
    induction_heads: tuple[int, ...]  # every layer-1 head whose induction score > MAJORITY
    ablated: dict  # layer-1 head -> RepeatLosses with that head pattern-preservingly ablated
    ablated_all: RepeatLosses  # with every induction head ablated at once
    prev_offsets: tuple[float, ...]  # the prev head's attention at offsets 0, 1, 2, 3, 4 back
    k_partners: tuple[int, ...]  # layer-0 heads whose K-composition into it is well above random
    induction_without_prev: float  # the induction head's score with the prev head zeroed
    induction_without_partners: float  # ... with every one of `k_partners` zeroed
    attribution: dict  # component label -> mean direct logit attribution (second copy)
    attribution_first: dict  # same on the first copy
    qk_match: float  # fraction of bytes whose composed-QK row peaks on the diagonal
    qk_direct_match: float  # the same for the direct path (no composition)
    ov_copy: float  # fraction of bytes whose OV row peaks on the diagonal
    prev_position: float  # fraction of positions whose positional QK peaks one back
    matrices: dict  # name -> 2-d tensor, for the figures


def find_circuit(model: HookedTransformer, tokens: Tensor) -> Circuit:
    """Locate and measure the induction circuit of a two-layer attention-only model."""
    processed = process_weights(model)  # layer norms folded: the weights are the circuit
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    prev = prev_token_scores(model, cache)
    induction = induction_scores(model, cache=cache, tokens=tokens)
    composition = {kind: composition_scores(processed, kind) for kind in "QKV"}
    head = int(induction.scores[1].argmax())
    k_scores, k = composition["K"].scores[0, :, 1, head], composition["K"]
    partner = int(k_scores.argmax())
    partners = tuple(int(i) for i in (k_scores > k.baseline + SIGMAS * k.baseline_std).nonzero())
    heads = tuple(h for h in range(model.cfg.n_heads) if induction[1, h] > MAJORITY) or (head,)
    ablated = {}
    with torch.no_grad():
        for h in range(model.cfg.n_heads):
            ablated_logits = pattern_preserving_ablation(model, tokens, (1, h))
            ablated[h] = repeat_losses(ablated_logits, tokens)
        all_logits = pattern_preserving_ablation(model, tokens, [(1, h) for h in heads])
    return Circuit(
        induction_head=head,
        prev_head=partner,
        prev_scores=prev,
        induction=induction,
        copying=copying_scores(processed, "OV"),
        composition=composition,
        clean=repeat_losses(logits, tokens),
        induction_heads=heads,
        ablated=ablated,
        ablated_all=repeat_losses(all_logits, tokens),
        prev_offsets=offset_profile(model, cache, tokens, partner),
        k_partners=partners,
        induction_without_prev=_induction_without(model, tokens, [partner], head),
        induction_without_partners=_induction_without(model, tokens, list(partners), head),
        attribution=_attribution(model, cache, tokens, second=True),
        attribution_first=_attribution(model, cache, tokens, second=False),
        **_weight_circuits(processed, partner, head),
    )


def offset_profile(
    model: HookedTransformer, cache: object, tokens: Tensor, head: int, n_offsets: int = 5
) -> tuple[float, ...]:
    """Mean attention of layer-0 `head` to the token `k` back, for k = 0 .. n_offsets - 1."""

    def target(k: int):
        def offset(tokens: Tensor) -> Tensor:
            batch, n = tokens.shape
            return torch.ones(n - k).diag(-k).expand(batch, n, n)

        offset.__name__ = f"{k} back"
        return offset

    return tuple(detect_head(model, target(k), cache, tokens)[0, head] for k in range(n_offsets))


def _induction_without(
    model: HookedTransformer, tokens: Tensor, prev: list[int], head: int
) -> float:
    """The induction head's score when layer-0 heads `prev` write nothing (patterns free).

    Pattern-preserving ablation would freeze the induction head's pattern, hiding exactly
    what K-composition does; here every later pattern is recomputed.
    """

    def zero(z: Tensor, hook: object) -> Tensor:
        z = z.clone()
        z[:, :, prev] = 0.0
        return z

    with torch.no_grad(), model.hooks(fwd_hooks=[(get_act_name("z", 0), zero)]):
        _, cache = model.run_with_cache(tokens, names_filter=lambda n: "pattern" in n)
    return induction_scores(model, cache=cache, tokens=tokens)[1, head]


def _attribution(model: HookedTransformer, cache: object, tokens: Tensor, second: bool) -> dict:
    """Mean direct logit attribution to the correct next token, per component."""
    decomposition = decompose_resid(model, cache, layer=None, granularity="head")
    targets = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)  # last column is unused
    attribution = direct_logit_attribution(model, cache, decomposition, targets)
    positions = slice(PERIOD, 2 * PERIOD) if second else slice(1, PERIOD)
    values = attribution.contributions[:, :, positions].mean(dim=(1, 2))
    return dict(zip(attribution.labels, values.tolist(), strict=True))


def _weight_circuits(model: HookedTransformer, prev: int, head: int) -> dict:
    """The circuits of the two heads in token and position space (module `_induction_text`)."""
    printable = torch.arange(32, 127)  # the bytes a reader can see on the axes
    W_E, W_pos, W_U = model.W_E[printable], model.W_pos, model.W_U[:, printable]
    with torch.no_grad():
        QK_prev = model.W_Q[0, prev] @ model.W_K[0, prev].T
        OV_prev = model.W_V[0, prev] @ model.W_O[0, prev]
        QK_ind = model.W_Q[1, head] @ model.W_K[1, head].T
        OV_ind = model.W_V[1, head] @ model.W_O[1, head]
        positional = W_pos @ QK_prev @ W_pos.T  # query position x key position
        composed = W_E @ QK_ind @ (W_E @ OV_prev).T  # query byte x byte *before* the key
        direct = W_E @ QK_ind @ W_E.T  # query byte x key byte, no composition
        ov = W_E @ OV_ind @ W_U  # attended byte x logit of each byte
    causal = torch.ones_like(positional, dtype=torch.bool).tril()
    best_key = positional.masked_fill(~causal, -torch.inf)[1:].argmax(-1)
    diagonal = torch.arange(len(printable))
    return {
        "qk_match": float((composed.argmax(-1) == diagonal).float().mean()),
        "qk_direct_match": float((direct.argmax(-1) == diagonal).float().mean()),
        "ov_copy": float((ov.argmax(-1) == diagonal).float().mean()),
        "prev_position": float((best_key == torch.arange(len(best_key))).float().mean()),
        "matrices": {"positional": positional, "composed": composed, "direct": direct, "ov": ov},
    }


# ---------------------------------------------------------------------- in-context learning
@dataclasses.dataclass(frozen=True)
class TextLosses:
    """Per-position held-out loss of a model, and its in-context-learning score."""

    per_position: Tensor  # [pos-1]
    icl_score: float  # late minus early (negative: the context helps), Olsson et al.
    icl_stderr: float  # standard error of that difference over the windows


EARLY = slice(8, 24)  # predictions of tokens 9..24: little context yet
LATE = slice(96, 127)  # predictions of tokens 97..127: nearly the whole context


def text_losses(model: HookedTransformer, windows: Tensor) -> TextLosses:
    """Loss per position on held-out windows, and late-minus-early with its error."""
    with torch.no_grad():  # in chunks: small batches stay in the CPU's caches
        chunks = windows.split(64)
        loss = torch.cat([model(c, return_type="loss", loss_per_token=True) for c in chunks])
    difference = loss[:, LATE].mean(1) - loss[:, EARLY].mean(1)
    return TextLosses(
        per_position=loss.mean(0),
        icl_score=float(difference.mean()),
        icl_stderr=float(difference.std() / len(difference) ** 0.5),
    )


@dataclasses.dataclass(frozen=True)
class Bigram:
    """The 0-layer model's held-out loss beside the corpus's unigram and bigram losses."""

    model_loss: float
    bigram_loss: float  # bigram model of the train split (add-0.1), on the same predictions
    unigram_loss: float

    @property
    def share(self) -> float:
        """How much of the unigram-to-bigram gain the model gets (1 = all of it)."""
        return (self.unigram_loss - self.model_loss) / (self.unigram_loss - self.bigram_loss)


def bigram_comparison(model: HookedTransformer, train: Tensor, windows: Tensor) -> Bigram:
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


@dataclasses.dataclass(frozen=True)
class Dynamics:
    """Induction and in-context-learning scores of each shipped checkpoint."""

    steps: tuple[int, ...]
    induction: tuple[float, ...]  # best layer-1 prefix-matching score
    repeat_icl: tuple[float, ...]  # first-copy minus second-copy loss
    text_icl: tuple[float, ...]  # held-out late-minus-early loss
    history: dict  # the training run's own evaluations, every few steps

    def history_window(self) -> tuple[int, int]:
        """The steps of the run's evaluations where the repeat ICL first passes 20% and 80%
        of its rise from the first evaluation to the largest (10% is within the noise of
        the slow rise before the bump)."""
        steps, first, second = (self.history[k] for k in ("step", "repeat_first", "repeat_second"))
        icl = [a - b for a, b in zip(first, second, strict=True)]
        low, high = icl[0], max(icl)
        start = next(s for s, v in zip(steps, icl, strict=True) if v >= low + 0.2 * (high - low))
        end = next(s for s, v in zip(steps, icl, strict=True) if v >= low + 0.8 * (high - low))
        return start, end

    def rise_window(self, values: tuple[float, ...]) -> tuple[int, int]:
        """The two consecutive checkpoints between which `values` rises the most."""
        rises = [b - a for a, b in itertools.pairwise(values)]
        i = max(range(len(rises)), key=rises.__getitem__)
        return self.steps[i], self.steps[i + 1]


def dynamics(name: str, tokens: Tensor, windows: Tensor) -> Dynamics:
    """Scores of every shipped checkpoint of `name`."""
    info = pretrained_info(name)
    induction, repeat_icl, text_icl = [], [], []
    for step in info.checkpoints:
        model = HookedTransformer.from_pretrained(name, checkpoint_value=step)
        with torch.no_grad():
            logits, cache = model.run_with_cache(tokens, names_filter=lambda n: "pattern" in n)
        induction.append(float(induction_scores(model, cache=cache, tokens=tokens).scores[1].max()))
        repeat_icl.append(repeat_losses(logits, tokens).icl)
        text_icl.append(text_losses(model, windows).icl_score)
    _, metadata = read_config(info.path)
    history = {k: [e[k] for e in metadata["history"]] for k in metadata["history"][0]}
    return Dynamics(info.checkpoints, tuple(induction), tuple(repeat_icl), tuple(text_icl), history)
