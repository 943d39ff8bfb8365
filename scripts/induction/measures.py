"""Measurements behind the induction-circuit report (`scripts/induction`).

The measures and thresholds themselves are `analysis.induction`'s, shared with
`tests/shipped/test_induction_findings.py`; this module gathers what the report needs beside
them (the circuits in token space, direct logit attribution, every checkpoint's scores) into
small frozen dataclasses that the report script turns into findings, figures and text.
"""

import dataclasses
import functools
import math

import torch
from torch import Tensor

from analysis import copying_scores, decompose_resid, direct_logit_attribution
from analysis.induction import (
    ABLATIONS,
    PERIOD,
    CircuitHeads,
    RepeatLosses,
    ablate_heads,
    checkpoint_scores,
    induction_without,
    locate_circuit,
    offset_profile,
    repeat_losses,
    repeated_tokens,
    text_losses,
)
from hookedattn import HookedTransformer, process_weights
from hookedattn.core._pretrained import pretrained_info
from hookedattn.core._weights_io import read_config

REFERENCE_SEED = 1  # the mean-ablation reference batch: other random bytes, same shape


@dataclasses.dataclass(frozen=True)
class Circuit:
    """The two heads of the induction circuit and every measurement about them."""

    heads: CircuitHeads  # which heads, and the head and composition scores that chose them
    copying: object  # CopyingScores of the full OV circuits
    clean: RepeatLosses
    ablated: dict  # layer-1 head -> RepeatLosses with that head zero-ablated
    ablated_all: dict  # "zero", "mean" -> RepeatLosses with every induction head ablated
    prev_offsets: tuple[float, ...]  # the prev head's attention at offsets 0, 1, 2, 3, 4 back
    induction_without_prev: float  # the induction head's score with the prev head zeroed
    induction_without_partners: float  # ... with every K-composition partner zeroed
    attribution: dict  # component label -> mean direct logit attribution (second copy)
    attribution_first: dict  # same on the first copy
    qk_match: float  # fraction of bytes whose composed-QK row peaks on the diagonal
    qk_direct_match: float  # the same for the direct path (no composition)
    ov_copy: float  # fraction of bytes whose OV row peaks on the diagonal
    prev_position: float  # fraction of positions whose positional QK peaks one back
    matrices: dict  # name -> 2-d tensor, for the figures

    @property
    def induction_head(self) -> int:
        """The strongest induction head, in layer 1."""
        return self.heads.induction_head

    @property
    def prev_head(self) -> int:
        """Its strongest K-composition partner, in layer 0."""
        return self.heads.prev_head


def find_circuit(model: HookedTransformer, tokens: Tensor) -> Circuit:
    """Locate and measure the induction circuit of a two-layer attention-only model."""
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens)
    heads = locate_circuit(model, tokens, cache)
    p, h = heads.prev_head, heads.induction_head
    induction = heads.induction_heads() or (h,)
    reference = repeated_tokens(seed=REFERENCE_SEED, n_seq=len(tokens))
    processed = process_weights(model)  # layer norms folded: the weights are the circuit
    return Circuit(
        heads=heads,
        copying=copying_scores(processed, "OV"),
        clean=repeat_losses(logits, tokens, PERIOD),
        ablated={
            i: ablate_heads(model, tokens, [(1, i)], PERIOD, clean=cache)
            for i in range(model.cfg.n_heads)
        },
        ablated_all={
            method: ablate_heads(
                model,
                tokens,
                [(1, i) for i in induction],
                PERIOD,
                method=method,
                reference=None if method == "zero" else reference,
                clean=cache,
            )
            for method in ABLATIONS
        },
        prev_offsets=offset_profile(model, cache, tokens, p),
        induction_without_prev=induction_without(model, tokens, [p], h),
        induction_without_partners=induction_without(model, tokens, heads.k_partners(), h),
        attribution=_attribution(model, cache, tokens, second=True),
        attribution_first=_attribution(model, cache, tokens, second=False),
        **_weight_circuits(processed, p, h),
    )


def _attribution(model: HookedTransformer, cache: object, tokens: Tensor, second: bool) -> dict:
    """Mean direct logit attribution to the correct next token, per component."""
    decomposition = decompose_resid(model, cache, layer=None, granularity="head")
    targets = torch.cat([tokens[:, 1:], tokens[:, :1]], dim=1)  # last column is unused
    attribution = direct_logit_attribution(model, cache, decomposition, targets)
    positions = slice(PERIOD, 2 * PERIOD) if second else slice(1, PERIOD)
    values = attribution.contributions[:, :, positions].mean(dim=(1, 2))
    return dict(zip(attribution.labels, values.tolist(), strict=True))


def _weight_circuits(model: HookedTransformer, prev: int, head: int) -> dict:
    """The circuits of the two heads in token and position space (module `text`)."""
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


@dataclasses.dataclass(frozen=True)
class Dynamics:
    """Induction and in-context-learning scores of each shipped checkpoint.

    ICL in the one convention of `analysis.induction`: less context minus more, in nats.
    """

    steps: tuple[int, ...]
    induction: tuple[float, ...]  # best layer-1 induction (prefix-matching) score
    repeat_icl: tuple[float, ...]  # first-copy minus second-copy loss
    text_icl: tuple[float, ...]  # held-out early-minus-late loss
    heldout: tuple[float, ...]  # held-out loss over every prediction
    history: dict  # the training run's own evaluations, every few steps

    def history_has_induction(self) -> bool:
        """Whether the run evaluated the induction score (runs before it did not)."""
        return all(math.isfinite(v) for v in self.history["induction"])


def dynamics(name: str, tokens: Tensor, windows: Tensor) -> Dynamics:
    """Scores of every shipped checkpoint of `name`, its text losses on `windows`."""
    repeat = checkpoint_scores(name, tokens)
    load = functools.partial(HookedTransformer.from_pretrained, name)
    text = [text_losses(load(checkpoint_value=step), windows) for step in repeat.steps]
    _, metadata = read_config(pretrained_info(name).path)
    # Runs from before the induction score was evaluated lack it: NaN, as `Evaluation` says.
    keys = ["induction", *metadata["history"][0]]
    history = {k: [e.get(k, math.nan) for e in metadata["history"]] for k in keys}
    return Dynamics(
        steps=repeat.steps,
        induction=repeat.induction,
        repeat_icl=repeat.icl,
        text_icl=tuple(t.icl for t in text),
        heldout=tuple(t.mean for t in text),
        history=history,
    )
