"""The induction circuit of the shipped two-layer attention-only model, as a report.

    python scripts/induction_circuit.py                 # writes reports/induction-circuit/
    python scripts/induction_circuit.py --out DIR

Loads the shipped models (no training, no network), measures the findings of Elhage et al.
2021 and Olsson et al. 2022 on them against their baselines, and writes `report.md` with
PNG figures into the folder, printing where. It takes well under a minute on a laptop CPU.
The same findings, with the same thresholds, are the tests of `tests/test_findings.py`.

Figures and text are in `scripts/_induction_figures.py` and `scripts/_induction_text.py`;
this file measures.
"""

import argparse
import dataclasses
import itertools
import sys
import time
from pathlib import Path

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
from hookedattn.corpus import heldout_windows, load_stdlib_corpus, repeated_random_tokens
from hookedattn.loss import lm_cross_entropy_loss
from hookedattn.names import get_act_name
from hookedattn.pretrained import pretrained_info
from hookedattn.weights_io import read_config

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _induction_figures as figures
from _induction_text import write_report

# Thresholds, each read against a baseline (see the report's "Thresholds" section).
MAJORITY = 0.5  # a head "is" a previous-token / induction head: most attention on its target
SIGMAS = 3.0  # "well above" a random baseline: more than 3 of its standard deviations
FAR_BELOW = 0.5  # "far below" the order-blind bound: under half of it
MOST = 0.5  # "most" of the in-context learning: more than half of it
BIGRAM_SHARE = 0.9  # the 0-layer model gets >= 90% of the way from unigram to bigram loss

PERIOD = 63  # repeated random sequences: <bos>, then 63 random bytes, twice (127 tokens)
N_SEQ = 32
N_WINDOWS = 512  # held-out windows: the late-minus-early difference needs this many


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


# ---------------------------------------------------------------------- the report
@dataclasses.dataclass(frozen=True)
class Finding:
    """One row of the report's summary table."""

    name: str
    measured: str
    baseline: str
    threshold: str
    holds: bool


THRESHOLD_NOTES = [
    f"An *induction head* puts more than {MAJORITY} of its attention on its target token (a "
    f"majority); uniform causal attention puts about 1/position there. A *previous-token "
    f"head*: strictly, the same majority on the previous token; in its weak form, the head "
    f"of its layer with the highest previous-token score, whose attention peaks one back.",
    f"A score is *well above* a random baseline when it exceeds the baseline's mean by more "
    f"than {SIGMAS:.0f} of its standard deviations (composition: Monte-Carlo over Gaussian "
    f"matrices of the model's shapes; copying: 0, by symmetry, with the same spread).",
    f"*Far below* on the second copy: under {FAR_BELOW} x the order-blind loss (each byte "
    f"predicted by its frequency in the first copy). *Not* (the one-layer model): no lower "
    f"than that order-blind loss.",
    f"*Most* of the in-context learning: more than {MOST} of the first-minus-second-copy "
    f"loss difference. *The induction heads*: every layer-1 head with a score above {MAJORITY}.",
    f"The 0-layer model *approximates bigram statistics*: at least {BIGRAM_SHARE:.0%} of the "
    f"way from the unigram loss to the bigram loss, on the same held-out predictions.",
    "Late context *lower than early*: the mean difference is negative by more than "
    f"{SIGMAS:.0f} standard errors over the held-out windows.",
    "*The same window*: the induction score and the in-context-learning score rise the most "
    "between the same two consecutive checkpoints.",
]


def main(argv: list[str] | None = None) -> int:
    """Measure, draw and write the report; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("reports") / "induction-circuit")
    args = parser.parse_args(argv)
    out = args.out
    try:
        out.mkdir(parents=True, exist_ok=True)
        (out / ".write-test").write_text("")
        (out / ".write-test").unlink()
    except OSError as error:
        print(f"error: cannot write the report to {out}: {error}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    torch.manual_seed(0)
    say = _Stages(5)

    say("loading the shipped models and the held-out text")
    models = {name: HookedTransformer.from_pretrained(name) for name in _MODELS}
    corpus = load_stdlib_corpus()
    windows = heldout_windows(corpus.heldout, N_WINDOWS, models["attn-only-2l"].cfg.n_ctx)
    tokens = repeated_tokens()
    say("locating the induction circuit (head scores, composition, ablations)")
    two = models["attn-only-2l"]
    circuit = find_circuit(two, tokens)
    say("measuring in-context learning and the smaller models")
    with torch.no_grad():
        one_layer = repeat_losses(models["attn-only-1l"](tokens), tokens)
    one_layer_copying = copying_scores(process_weights(models["attn-only-1l"]), "OV")
    text = {name: text_losses(model, windows) for name, model in models.items()}
    say("scoring the checkpoints of attn-only-2l")
    dyn = dynamics("attn-only-2l", tokens, windows)
    info = pretrained_info("attn-only-2l")
    results = _Results(
        circuit=circuit,
        one_layer=one_layer,
        one_layer_copying=one_layer_copying,
        n_copying=int(
            (one_layer_copying.scores[0] > SIGMAS * one_layer_copying.baseline_std).sum()
        ),
        text_icl=text["attn-only-2l"],
        bigram=bigram_comparison(models["attn-only-0l"], corpus.train, windows),
        dynamics=dyn,
        induction_window=dyn.rise_window(dyn.induction),
        icl_window=dyn.rise_window(dyn.repeat_icl),
        history_window=dyn.history_window(),
        majority=MAJORITY,
        steps=info.training["step"],
        command=info.training["command"],
        torch_version=torch.__version__,
        seconds=0.0,
        findings=[],
        threshold_notes=THRESHOLD_NOTES,
    )
    results = dataclasses.replace(results, findings=_findings(results))
    say("drawing the figures and writing the report")
    figures.draw_all(out, two, results, {name: t.per_position for name, t in text.items()})
    results = dataclasses.replace(results, seconds=time.perf_counter() - started)
    path = write_report(out, results)
    held = sum(f.holds for f in results.findings)
    print(f"{held}/{len(results.findings)} findings hold; report written to {path}")
    return 0


class _Stages:
    """Prints `[i/n] what` to stderr: the long parts show progress."""

    def __init__(self, total: int) -> None:
        self.done, self.total = 0, total

    def __call__(self, text: str) -> None:
        self.done += 1
        print(f"[{self.done}/{self.total}] {text}", file=sys.stderr, flush=True)


_MODELS = ("attn-only-0l", "attn-only-1l", "attn-only-2l", "gelu-2l")


@dataclasses.dataclass(frozen=True)
class _Results:
    circuit: Circuit
    one_layer: RepeatLosses
    one_layer_copying: object
    n_copying: int
    text_icl: TextLosses
    bigram: Bigram
    dynamics: Dynamics
    induction_window: tuple[int, int]
    icl_window: tuple[int, int]
    history_window: tuple[int, int]
    majority: float
    steps: int
    command: str
    torch_version: str
    seconds: float
    findings: list
    threshold_notes: list


def _findings(r: _Results) -> list[Finding]:
    c = r.circuit
    p, h = c.prev_head, c.induction_head
    k, q, v = (float(c.composition[kind].scores[0, p, 1, h]) for kind in "KQV")
    k_base = c.composition["K"]
    removed = 1 - c.ablated_all.icl / c.clean.icl
    heads = ", ".join(f"L1H{i}" for i in c.induction_heads)
    n_heads = r.one_layer_copying.scores.shape[1]
    peak = max(range(len(c.prev_offsets)), key=c.prev_offsets.__getitem__)
    strongest = int(c.prev_scores.scores[0].argmax()) == p
    return [
        Finding(
            "0 layers: bigram statistics",
            f"{r.bigram.share:.0%} of unigram-to-bigram gain",
            f"unigram {r.bigram.unigram_loss:.3f}, bigram {r.bigram.bigram_loss:.3f} nats",
            f">= {BIGRAM_SHARE:.0%}",
            r.bigram.share >= BIGRAM_SHARE,
        ),
        Finding(
            "1 layer: most heads copy",
            f"{r.n_copying}/{n_heads} heads",
            f"0 ± {r.one_layer_copying.baseline_std:.3f}",
            f"> {n_heads // 2} heads above 3σ",
            r.n_copying > n_heads / 2,
        ),
        Finding(
            f"2 layers: induction head L1H{h}",
            f"{c.induction[1, h]:.3f}",
            f"uniform {c.induction.baseline:.3f}",
            f"> {MAJORITY}",
            c.induction[1, h] > MAJORITY,
        ),
        Finding(
            f"its top K-partner L0H{p} is the layer's previous-token head",
            f"score {c.prev_scores[0, p]:.3f}; attention peaks {peak} back",
            f"uniform {c.prev_scores.baseline:.3f}",
            "top score in L0, peak 1 back",
            strongest and peak == 1,
        ),
        Finding(
            f"... holding a majority of L0H{p}'s attention (strict)",
            f"{c.prev_scores[0, p]:.3f}",
            f"uniform {c.prev_scores.baseline:.3f}",
            f"> {MAJORITY}",
            c.prev_scores[0, p] > MAJORITY,
        ),
        Finding(
            f"K-composition L0H{p} -> L1H{h}",
            f"{k:.3f}",
            f"{k_base.baseline:.3f} ± {k_base.baseline_std:.3f}",
            f"> {k_base.baseline + SIGMAS * k_base.baseline_std:.3f}",
            k > k_base.baseline + SIGMAS * k_base.baseline_std,
        ),
        Finding(
            "K- above Q- and V-composition (same pair)",
            f"K {k:.3f}",
            f"Q {q:.3f}, V {v:.3f}",
            "K > Q and K > V",
            k > q and k > v,
        ),
        Finding(
            "2 layers: second copy far below",
            f"{c.clean.second:.3f} nats",
            f"order-blind {c.clean.order_blind:.3f}",
            f"< {FAR_BELOW * c.clean.order_blind:.3f}",
            c.clean.second < FAR_BELOW * c.clean.order_blind,
        ),
        Finding(
            "1 layer: second copy not below order-blind",
            f"{r.one_layer.second:.3f} nats",
            f"order-blind {c.clean.order_blind:.3f}",
            f">= {c.clean.order_blind:.3f}",
            r.one_layer.second >= c.clean.order_blind,
        ),
        Finding(
            "held-out text: late context below early",
            f"{r.text_icl.icl_score:+.3f} nats",
            f"0 ± {r.text_icl.icl_stderr:.3f} (s.e.)",
            f"< {-SIGMAS * r.text_icl.icl_stderr:+.3f}",
            r.text_icl.icl_score < -SIGMAS * r.text_icl.icl_stderr,
        ),
        Finding(
            f"ablating the induction heads ({heads}) removes most ICL",
            f"{removed:.0%} removed",
            f"ICL {c.clean.icl:.3f} nats",
            f"> {MOST:.0%}",
            removed > MOST,
        ),
        Finding(
            "induction and ICL rise together",
            f"{r.induction_window} and {r.icl_window}",
            f"checkpoints {list(r.dynamics.steps)}",
            "same window",
            r.induction_window == r.icl_window,
        ),
    ]


if __name__ == "__main__":
    raise SystemExit(main())
