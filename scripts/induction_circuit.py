"""The induction circuit of the shipped two-layer attention-only model, as a report.

    python scripts/induction_circuit.py                 # writes reports/induction-circuit/
    python scripts/induction_circuit.py --out DIR

Loads the shipped models (no training, no network), measures the findings of Elhage et al.
2021 and Olsson et al. 2022 on them against their baselines, and writes `report.md` with
PNG figures into the folder, printing where. It takes well under a minute on a laptop CPU.
The same findings, with the same thresholds, are the tests of `tests/test_findings.py`.

Figures and text are in `scripts/_induction_figures.py` and `scripts/_induction_text.py`;
the measurements are in `scripts/_induction_measures.py`.
"""

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

from analysis import (
    copying_scores,
)
from hookedattn import HookedTransformer, process_weights
from hookedattn.corpus import heldout_windows, load_stdlib_corpus
from hookedattn.pretrained import pretrained_info

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _induction_figures as figures
from _induction_measures import (
    MAJORITY,
    SIGMAS,
    Bigram,
    Circuit,
    Dynamics,
    RepeatLosses,
    TextLosses,
    bigram_comparison,
    dynamics,
    find_circuit,
    repeat_losses,
    repeated_tokens,
    text_losses,
)
from _induction_text import write_report

# Thresholds, each read against a baseline (see the report's "Thresholds" section).
FAR_BELOW = 0.5  # "far below" the order-blind bound: under half of it
MOST = 0.5  # "most" of the in-context learning: more than half of it
BIGRAM_SHARE = 0.9  # the 0-layer model gets >= 90% of the way from unigram to bigram loss

N_WINDOWS = 512  # held-out windows: the late-minus-early difference needs this many


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
