"""The induction circuit of the shipped two-layer attention-only model, as a report.

    python scripts/induction              # writes reports/induction-circuit/
    python scripts/induction --out DIR

Loads the shipped models (no training, no network), measures the findings of Elhage et al.
2021 and Olsson et al. 2022 on them against their baselines, and writes `report.md` with
PNG figures into the folder, printing where. It takes under a minute of CPU (the README
gives measured times). The measures and thresholds are `analysis.induction`'s, which
`tests/shipped/test_induction_findings.py` checks on the same models.

This is the folder's `__main__.py`; the rest of `scripts/induction/` is its parts, imported
by their plain names (running the folder puts it first on `sys.path`). Figures and text are
in `figures.py` and `text.py`; what the report measures beside `analysis.induction` is in
`measures.py`, its sections on SAE features and on discovering the circuit from its edges
(`analysis.discovery`) in `features.py` and `discovery.py`.
"""

import argparse
import dataclasses
import sys
import time
from pathlib import Path

import torch

from analysis import copying_scores, view
from analysis.induction import (
    BIGRAM_SHARE,
    FAR_BELOW,
    MAJORITY,
    MOST,
    PERIOD,
    SIGMAS,
    UNIFORM_BYTE_LOSS,
    Bigram,
    RepeatLosses,
    TextLosses,
    bigram_comparison,
    composition_floor,
    crossing,
    repeat_losses,
    repeated_tokens,
    steepest_rise,
    text_losses,
)
from hookedattn import HookedTransformer, process_weights
from hookedattn.core._pretrained import pretrained_info
from hookedattn.training.corpus import heldout_windows, load_stdlib_corpus

sys.path.insert(0, str(Path(__file__).resolve().parent))
import figures
from discovery import discovery_section
from features import feature_section, insert_section
from measures import Circuit, Dynamics, dynamics, find_circuit
from text import write_report

N_WINDOWS = 512  # held-out windows: the early-minus-late difference needs this many
N_CHECKPOINT_WINDOWS = 128  # for each checkpoint: enough to follow the trend, 4x cheaper
TWO = "bytes-attn-only-2l"


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
    f"head* puts the same majority on the previous token of repeated random bytes (`<bos>` "
    f"first, as in training), is the top previous-token head of its layer, and its "
    f"attention peaks one back.",
    f"A score is *well above* a random baseline when it exceeds the baseline's mean by more "
    f"than {SIGMAS:.0f} of its standard deviations (composition: Monte-Carlo over Gaussian "
    f"matrices of the model's shapes; copying: 0, by symmetry, with the same spread). A "
    f"composition score must also exceed 2/sqrt(d_model), more than two random directions "
    f"overlap.",
    f"*Far below* on the second copy: under {FAR_BELOW} x the order-blind loss (each byte "
    f"predicted by its frequency in the first copy). *Not* (the one-layer model): no lower "
    f"than that order-blind loss.",
    f"*Most* of the in-context learning: more than {MOST} of it removed, with the second "
    f"copy's loss no higher than ln 256 = {UNIFORM_BYTE_LOSS:.2f} (above it, the ablated "
    f"model does worse than knowing nothing where the context helps: the ablation breaks "
    f"the model rather than removing one ability). *The induction heads*: every layer-1 head "
    f"with a score above {MAJORITY}.",
    f"The 0-layer model *approximates bigram statistics*: at least {BIGRAM_SHARE:.0%} of the "
    f"way from the unigram loss to the bigram loss, on the same held-out predictions.",
    "Late context *lower than early*: the mean early-minus-late difference is positive by "
    f"more than {SIGMAS:.0f} standard errors over the held-out windows.",
    "*The same window*: the induction score and the in-context learning rise the most "
    "between the same two consecutive checkpoints; in the run's own evaluations, both pass "
    "half of their rise within one evaluation interval of each other.",
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
    started, cpu_started = time.perf_counter(), time.process_time()
    torch.manual_seed(0)
    say = _Stages(5)
    two, results = _measure(say)
    say("drawing the figures, finding the circuit from its edges, writing the report")
    text = {name: t.per_position for name, t in results.text.items()}
    figures.draw_all(out, two, results, text)
    # The attention figure's sequence, every head, as a page to explore beside the figures.
    head = f"L1H{results.circuit.induction_head}"
    view.attention(two, figures.figure_prompt(), head=head).save(out / "attention.html")
    features = feature_section(two, repeated_tokens(), PERIOD)  # the shipped SAE's features
    c = results.circuit  # the circuit found again from its edges alone (circuit.html)
    discovery = discovery_section(
        out, two, repeated_tokens(), PERIOD, c.prev_head, c.induction_head
    )
    results = dataclasses.replace(
        results,
        seconds=time.perf_counter() - started,
        cpu_seconds=time.process_time() - cpu_started,
    )
    path = write_report(out, results)
    insert_section(path, features)
    insert_section(path, discovery)
    held = sum(f.holds for f in results.findings)
    print(f"{held}/{len(results.findings)} findings hold; report written to {path}")
    return 0


def _measure(say: "_Stages") -> tuple[HookedTransformer, "_Results"]:
    """Every measurement of the report, on the shipped models; the two-layer model too."""
    say("loading the shipped models and the held-out text")
    models = {name: HookedTransformer.from_pretrained(name) for name in _MODELS}
    corpus = load_stdlib_corpus()
    two = models[TWO]
    windows = heldout_windows(corpus.heldout, N_WINDOWS, two.cfg.n_ctx)
    tokens = repeated_tokens()
    say("locating the induction circuit (head scores, composition, ablations)")
    circuit = find_circuit(two, tokens)
    say("measuring in-context learning and the smaller models")
    one = models["bytes-attn-only-1l"]
    with torch.no_grad():
        one_layer = repeat_losses(one(tokens), tokens, PERIOD)
    one_layer_copying = copying_scores(process_weights(one), "OV")
    say(f"scoring the checkpoints of {TWO}")
    dyn = dynamics(TWO, tokens, windows[:: N_WINDOWS // N_CHECKPOINT_WINDOWS])
    info = pretrained_info(TWO)
    results = _Results(
        circuit=circuit,
        one_layer=one_layer,
        one_layer_copying=one_layer_copying,
        n_copying=int(one_layer_copying.above_random(SIGMAS)[0].sum()),
        text={name: text_losses(model, windows) for name, model in models.items()},
        bigram=bigram_comparison(models["bytes-attn-only-0l"], corpus.train, windows),
        zero_layer_training_loss=pretrained_info("bytes-attn-only-0l").training["final_eval"][
            "heldout_loss"
        ],
        dynamics=dyn,
        **_windows(dyn),
        composition_floor=composition_floor(two.cfg.d_model),
        config=two.cfg,
        n_windows=N_WINDOWS,
        steps=info.training["step"],
        command=info.training["command"],
        torch_version=torch.__version__,
        seconds=0.0,
        cpu_seconds=0.0,
        findings=[],
        threshold_notes=THRESHOLD_NOTES,
    )
    return two, dataclasses.replace(results, findings=_findings(results))


def _windows(dyn: Dynamics) -> dict[str, tuple[int, int] | None]:
    """Where induction and in-context learning rise, on the checkpoints and in the run's
    evaluations: the `_Results` fields of that name."""
    history = dyn.history
    steps = history["step"]
    icl = [a - b for a, b in zip(history["repeat_first"], history["repeat_second"], strict=True)]
    half = (crossing(steps, history["induction"], 0.5), crossing(steps, icl, 0.5))
    return {
        "induction_window": steepest_rise(dyn.steps, dyn.induction),
        "icl_window": steepest_rise(dyn.steps, dyn.repeat_icl),
        "history_window": (crossing(steps, icl, 0.2), crossing(steps, icl, 0.8)),
        "history_half": half if dyn.history_has_induction() else None,
    }


class _Stages:
    """Prints `[i/n] what` to stderr: the long parts show progress."""

    def __init__(self, total: int) -> None:
        self.done, self.total = 0, total

    def __call__(self, text: str) -> None:
        self.done += 1
        print(f"[{self.done}/{self.total}] {text}", file=sys.stderr, flush=True)


_MODELS = ("bytes-attn-only-0l", "bytes-attn-only-1l", TWO, "bytes-gelu-2l")


@dataclasses.dataclass(frozen=True)
class _Results:
    circuit: Circuit
    one_layer: RepeatLosses
    one_layer_copying: object
    n_copying: int
    text: dict[str, TextLosses]
    bigram: Bigram
    zero_layer_training_loss: float  # the training run's last evaluation (64 windows)
    dynamics: Dynamics
    induction_window: tuple[int, int]
    icl_window: tuple[int, int]
    history_window: tuple[int, int]  # the run's evaluations: ICL at 20% and 80% of its rise
    history_half: tuple[int, int] | None  # ... induction score and ICL at half their rise
    composition_floor: float
    config: object  # the two-layer model's HookedTransformerConfig
    n_windows: int
    steps: int
    command: str
    torch_version: str
    seconds: float
    cpu_seconds: float
    findings: list
    threshold_notes: list

    @property
    def text_icl(self) -> TextLosses:
        """The two-layer model's losses on held-out text."""
        return self.text[TWO]


def _ablation_finding(name: str, ablation: RepeatLosses, clean: RepeatLosses) -> Finding:
    removed = 1 - ablation.icl / clean.icl
    broken = ablation.above_uniform
    flag = (
        f"; **second copy {ablation.second:.2f} > ln 256**: the model breaks"
        if broken
        else f"; second copy {ablation.second:.2f}"
    )
    return Finding(
        name,
        f"{removed:.0%} removed{flag}",
        f"ICL {clean.icl:.3f} nats",
        f"> {MOST:.0%}, second copy <= {UNIFORM_BYTE_LOSS:.2f}",
        removed > MOST and not broken,
    )


def _findings(r: _Results) -> list[Finding]:
    """Every row of the summary table: the smaller models, the circuit, in-context learning."""
    return _smaller_findings(r) + _circuit_findings(r) + _icl_findings(r)


def _smaller_findings(r: _Results) -> list[Finding]:
    n_heads = r.one_layer_copying.scores.shape[1]
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
    ]


def _circuit_findings(r: _Results) -> list[Finding]:
    c, heads = r.circuit, r.circuit.heads
    p, h = c.prev_head, c.induction_head
    peak = max(range(len(c.prev_offsets)), key=c.prev_offsets.__getitem__)
    strongest = int(heads.prev_scores.scores[0].argmax()) == p
    return [
        Finding(
            f"2 layers: induction head L1H{h}",
            f"{heads.induction[1, h]:.3f}",
            f"uniform {heads.induction.baseline:.3f}",
            f"> {MAJORITY}",
            heads.induction[1, h] > MAJORITY,
        ),
        Finding(
            f"its top K-partner L0H{p} is the layer's top previous-token head",
            f"score {heads.prev_scores[0, p]:.3f}; attention peaks {peak} back",
            f"uniform {heads.prev_scores.baseline:.3f}",
            "top score in L0, peak 1 back",
            strongest and peak == 1,
        ),
        Finding(
            f"L0H{p} puts a majority on the previous token",
            f"{heads.prev_scores[0, p]:.3f}",
            f"uniform {heads.prev_scores.baseline:.3f}",
            f"> {MAJORITY}",
            heads.prev_scores[0, p] > MAJORITY,
        ),
        *_composition_findings(r),
    ]


def _composition_findings(r: _Results) -> list[Finding]:
    heads = r.circuit.heads
    p, h = r.circuit.prev_head, r.circuit.induction_head
    k, q, v = (heads.composition_of_pair(kind) for kind in "KQV")
    k_base = heads.composition["K"]
    k_threshold = max(r.composition_floor, k_base.threshold(SIGMAS))
    return [
        Finding(
            f"K-composition L0H{p} -> L1H{h}",
            f"{k:.3f}",
            f"random {k_base.baseline:.3f} ± {k_base.baseline_std:.3f}; "
            f"2/sqrt(d_model) {r.composition_floor:.3f}",
            f"> {k_threshold:.3f}",
            k > k_threshold,
        ),
        Finding(
            "K- above Q- and V-composition (same pair)",
            f"K {k:.3f}",
            f"Q {q:.3f}, V {v:.3f}",
            "K > Q and K > V",
            k > q and k > v,
        ),
    ]


def _icl_findings(r: _Results) -> list[Finding]:
    c, heads = r.circuit, r.circuit.heads
    names = ", ".join(f"L1H{i}" for i in heads.induction_heads()) or f"L1H{c.induction_head}"
    interval = r.dynamics.history["step"][1] - r.dynamics.history["step"][0]
    return [
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
            "held-out text: ICL, early minus late",
            f"{r.text_icl.icl:+.3f} nats",
            f"0 ± {r.text_icl.icl_stderr:.3f} (s.e.)",
            f"> {SIGMAS * r.text_icl.icl_stderr:+.3f}",
            r.text_icl.icl > SIGMAS * r.text_icl.icl_stderr,
        ),
        _ablation_finding(
            f"zero-ablating {names} removes most ICL", c.ablated_all["zero"], c.clean
        ),
        _ablation_finding(
            f"control: mean-ablating {names} removes most ICL", c.ablated_all["mean"], c.clean
        ),
        Finding(
            "induction and ICL rise together (checkpoints)",
            f"{r.induction_window} and {r.icl_window}",
            f"{len(r.dynamics.steps)} checkpoints",
            "same window",
            r.induction_window == r.icl_window,
        ),
        _history_finding(r.history_half, interval),
    ]


def _history_finding(half: tuple[int, int] | None, interval: int) -> Finding:
    name = "... (the run's evaluations): half of each rise"
    if half is None:
        measured = "not measured: the run did not evaluate the induction score"
        return Finding(name, measured, f"evaluated every {interval} steps", "-", False)
    return Finding(
        name,
        f"steps {half[0]} and {half[1]}",
        f"evaluated every {interval} steps",
        f"<= {interval} steps apart",
        abs(half[0] - half[1]) <= interval,
    )


if __name__ == "__main__":
    raise SystemExit(main())
