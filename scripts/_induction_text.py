"""The Markdown of `scripts/induction_circuit.py`'s report, from its measurements.

Written for a reader of the seed worklog: it uses the worklog's notation (`x @ W_Q`, the
attention weights, `W_OV = W_V @ W_O`) and ends by answering its three questions.
"""

from pathlib import Path


def _table(columns: list[str], rows: list[list[object]]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, bool):
        return "yes" if value else "**no**"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def findings_table(findings: list) -> str:
    """The summary: one row per finding, with its measurement, baseline and threshold."""
    rows = [[f.name, f.measured, f.baseline, f.threshold, f.holds] for f in findings]
    return _table(["finding", "measured", "baseline", "threshold", "holds"], rows)


def write_report(out: Path, r: object) -> Path:
    """Write `report.md` into `out` from the measurements `r` (see `induction_circuit.main`)."""
    c = r.circuit
    p, h = c.prev_head, c.induction_head
    P, H = f"L0H{p}", f"L1H{h}"
    k_score = float(c.composition["K"].scores[0, p, 1, h])
    q_score = float(c.composition["Q"].scores[0, p, 1, h])
    v_score = float(c.composition["V"].scores[0, p, 1, h])
    base, std = c.composition["K"].baseline, c.composition["K"].baseline_std
    removed = {head: 1 - losses.icl / c.clean.icl for head, losses in c.ablated.items()}
    ablation_rows = [
        [f"L1H{head}", losses.first, losses.second, losses.icl, removed[head]]
        for head, losses in sorted(c.ablated.items())
    ]
    sections = [
        f"# How `attn-only-2l` does induction\n\n"
        f"Written by `python scripts/induction_circuit.py` in {r.seconds:.0f} s from the "
        f"shipped models (`HookedTransformer.from_pretrained`), torch {r.torch_version}. "
        f"Every number below is measured by that run; every threshold is stated against a "
        f"baseline (section *Thresholds*), and `tests/test_findings.py` checks the same ones.",
        "## Findings\n\n" + findings_table(r.findings),
        "## The model, in the worklog's notation\n\n"
        f"`attn-only-2l` reads UTF-8 bytes (`<bos>` first), has two layers of 8 attention "
        f"heads (`d_head` 16) on a 64-wide residual stream, layer norms, and no MLPs. It was "
        f"trained for {r.steps} steps on the Python standard library's own source, half of "
        f"each batch being repeated random bytes (`{r.command}`). The worklog's step 1-7 is "
        f"one of its attention sub-layers: with the rows `x` of the residual stream,\n\n"
        f"    scores  = (x @ W_Q[h]) @ (x @ W_K[h]).T / sqrt(d_head)  # QK: where to look\n"
        f"    weights = softmax(causal_mask(scores))\n"
        f"    out     = weights @ (x @ W_V[h]) @ W_O[h]               # OV: what to move\n"
        f"    x       = x + sum over heads h of out                   # the stream\n\n"
        f"Row vectors throughout: `QK = W_Q @ W_K.T` and `OV = W_V @ W_O` (`d_model x "
        f"d_model`, rank 16). The circuits below are read from weights with the layer "
        f"norms folded in (`process_weights`), so a norm's only remaining effect is one "
        f"positive scale per token, which changes no argmax within a row.",
        "## In-context learning\n\n"
        f"![loss by position](icl_curve.png)\n\n"
        f"On `<bos>` + 63 random bytes + the same 63 bytes again, the two-layer model's loss "
        f"on the first copy is {c.clean.first:.2f} nats (ln 256 = 5.55: nothing to learn) "
        f"and on the second copy {c.clean.second:.2f}. A model that knew *which* bytes "
        f"occurred but not in what order could get to {c.clean.order_blind:.2f} "
        f"(each byte predicted by its frequency in the first copy). The one-layer model "
        f"gets {r.one_layer.second:.2f} on the second copy, {r.one_layer.first:.2f} on the "
        f"first: without a second layer its heads cannot find the byte that came *next* "
        f"last time. On held-out stdlib files "
        f"the two-layer model's loss late in the context (tokens 97-127) is "
        f"{-r.text_icl.icl_score:.3f} ± {r.text_icl.icl_stderr:.3f} nats lower than early "
        f"(tokens 9-24): identifiers and phrases recur within a file.",
        "## Two heads\n\n"
        f"![attention on a repeated sequence](attention_patterns.png)\n\n"
        f"![head scores](head_scores.png)\n\n"
        f"**{H}, the strongest induction head**, puts {c.induction[1, h]:.2f} of its "
        f"attention on the token *after* an earlier copy of the query token (uniform causal "
        f"attention: {c.induction.baseline:.3f}): in the figure, the stripe in the second "
        f"half, one position right of where the current token appeared before. In the first "
        f"half there is no earlier copy, and it rests on `<bos>`. It is not alone: "
        f"{len(c.induction_heads)} of the 8 layer-1 heads score above {r.majority} "
        f"({', '.join(f'L1H{i}' for i in c.induction_heads)}).\n\n"
        f"**{P}, its previous-token partner**, is a *soft* previous-token head. Its "
        f"attention to the token 0, 1, 2, 3, 4 positions back is "
        + ", ".join(f"{v:.2f}" for v in c.prev_offsets)
        + f": it peaks one back, and its previous-token score ({c.prev_scores[0, p]:.2f}; "
        f"uniform {c.prev_scores.baseline:.3f}) is the highest in layer 0, but it holds no "
        f"majority there, so the strict form of the papers' finding does not hold on this "
        f"model. Several layer-0 heads look the same: recency-weighted averages of the "
        f"last few tokens. Beside them, a current-token head attends to the query itself.",
        "## The QK circuit of the induction head: K-composition\n\n"
        f"![composition scores](composition.png)\n\n"
        f"{H} must attend to the key *after* an earlier copy of the query token. The key's "
        f"own token says nothing about that; what identifies it is the token *before* it. "
        f"{P} moves that token: at position j it attends mostly to j-1 and writes "
        f"(mostly) `x[j-1] @ OV_{P}` into the stream. {H} reads its keys from the stream "
        f"through `W_K`, so its keys can contain the previous token. How much of what {P} "
        f"writes {H}'s keys read is the K-composition score: the Frobenius norm of the "
        f"product `OV_{P} @ QK_{H}.T` relative to the norms of the two (Elhage et al. "
        f"2021):\n\n"
        f"    K-composition({P} -> {H}) = {k_score:.3f}  (random: {base:.3f} ± {std:.3f})\n"
        f"    Q-composition({P} -> {H}) = {q_score:.3f}\n"
        f"    V-composition({P} -> {H}) = {v_score:.3f}\n\n"
        f"{P} is {H}'s strongest K-composition partner, but "
        f"{len(c.k_partners)} layer-0 heads compose with it well above random "
        f"({', '.join(f'L0H{i}' for i in c.k_partners)}). Causally, with patterns "
        f"recomputed: zeroing {P}'s output lowers {H}'s induction score from "
        f"{c.induction[1, h]:.2f} to {c.induction_without_prev:.2f}; zeroing all of its "
        f"K-composition partners lowers it to {c.induction_without_partners:.2f}. The "
        f"previous token reaches the induction heads' keys through several soft heads "
        f"together: each smears the last few tokens with a different profile, and `W_K` "
        f"reads the combination in which the previous token stands out.\n\n"
        f"Composing the circuits in token space shows the mechanism: the matrix "
        f"`W_E @ QK_{H} @ (W_E @ OV_{P}).T` gives the attention score of a query byte "
        f"(rows) for a key whose *previous* byte is the column byte. Its largest entry in a "
        f"row is on the diagonal for {c.qk_match:.0%} of the printable bytes (chance: "
        f'1/95 = 1.1%): the query asks "was the token before you the same as me?". The '
        f"direct path `W_E @ QK_{H} @ W_E.T`, without {P}, peaks there for "
        f"{c.qk_direct_match:.0%} (second and third panels).\n\n"
        f"![circuits](circuits.png)\n\n"
        f"{P}'s own QK circuit is positional: `W_pos @ QK_{P} @ W_pos.T` (first panel) "
        f"favours recent keys, and peaks exactly one back for {c.prev_position:.0%} of query "
        f"positions.",
        "## The OV circuit of the induction head: copying\n\n"
        f"![direct logit attribution](logit_attribution.png)\n\n"
        f'Once {H} attends to the right key, its OV circuit must turn "I am looking at '
        f'byte b" into "predict b". The full OV circuit `W_E @ OV_{H} @ W_U` (last '
        f"panel above) has its largest logit on the diagonal for {c.ov_copy:.0%} of "
        f"printable bytes, and its copying score (sum of eigenvalues over sum of their "
        f"absolute values) is {c.copying.scores[1, h]:.2f} (random: 0 ± "
        f"{c.copying.baseline_std:.2f}). Direct logit attribution agrees: on the second "
        f"copy, {H} adds {c.attribution[H]:+.2f} to the correct byte's logit on average, "
        f"more than any other component; on the first copy it adds "
        f"{c.attribution_first[H]:+.2f}.",
        "## Removing the induction heads\n\n"
        f"Pattern-preserving ablation (Olsson et al. 2022) zeroes heads' outputs while "
        f"every head keeps the attention pattern of the clean run, so that what is removed "
        f"is those heads' writes alone. The in-context learning (first-copy minus "
        f"second-copy loss) of the clean model is {c.clean.icl:.2f} nats. One induction "
        f"head removed, the others make up for it; all of them removed, the in-context "
        f"learning is gone.\n\n"
        + _table(
            ["ablated", "first copy", "second copy", "ICL", "share of ICL removed"],
            [
                *ablation_rows,
                [
                    "all induction heads",
                    c.ablated_all.first,
                    c.ablated_all.second,
                    c.ablated_all.icl,
                    1 - c.ablated_all.icl / c.clean.icl,
                ],
            ],
        ),
        "## When the circuit forms\n\n"
        "![training dynamics](training_dynamics.png)\n\n"
        + _table(
            ["checkpoint step", "best L1 induction score", "repeat ICL (nats)", "text ICL"],
            [
                [s, i, a, t]
                for s, i, a, t in zip(
                    r.dynamics.steps,
                    r.dynamics.induction,
                    r.dynamics.repeat_icl,
                    r.dynamics.text_icl,
                    strict=True,
                )
            ],
        )
        + f"\n\nThe induction score rises the most between steps {r.induction_window[0]} "
        f"and {r.induction_window[1]}, the in-context-learning score between "
        f"{r.icl_window[0]} and {r.icl_window[1]}. The training run's own evaluations "
        f"(every 25 steps, lines in the figure) place the rise of the in-context learning "
        f"between steps {r.history_window[0]} and {r.history_window[1]} (20% to 80% of it). "
        f"The held-out loss rises a little meanwhile, the *induction bump*. The in-context "
        f"learning saturates soon after (the loss on the second copy cannot go below 0) "
        f"while the attention keeps sharpening: an earlier version of this test, which "
        f"compared where each score crosses half its range, put the induction score one "
        f"checkpoint later for that reason.",
        "## The smaller models\n\n"
        f"**0 layers.** With no attention, the logits depend on the current token alone: "
        f"the model can at best learn the bigram table. Its held-out loss is "
        f"{r.bigram.model_loss:.3f} nats; the bigram table of the training files gives "
        f"{r.bigram.bigram_loss:.3f} on the same predictions and the unigram table "
        f"{r.bigram.unigram_loss:.3f}, so it captures {r.bigram.share:.0%} of what the "
        f"previous byte tells about the next.\n\n"
        f"**1 layer.** Copying scores of its heads' full OV circuits: "
        + ", ".join(f"H{i} {v:.2f}" for i, v in enumerate(r.one_layer_copying.scores[0].tolist()))
        + f" (random: 0 ± {r.one_layer_copying.baseline_std:.2f}); "
        f"{r.n_copying}/8 are copying heads: attending to a byte raises that byte's logit. "
        f"On random bytes, where attending to any earlier byte is a guess, that is worth "
        f"little: {r.one_layer.second:.2f} nats on the second copy.",
        "## The worklog's questions\n\n"
        f"**What is the attention weight trying to tell us?** Which earlier position this "
        f"head moves information *from*, and nothing about what it moves. {P}'s weights say "
        f'"the last few positions, the previous one most", for every token alike; '
        f"{H}'s say \"the position after "
        f'an earlier copy of me", a question about *content* that it can only ask because '
        f"{P} has already written each token's predecessor into the stream.\n\n"
        f"**What happens in parallel, what in sequence?** Within a layer everything is "
        f"parallel: all positions, and all 8 heads, read the same stream and add their "
        f"outputs to it. Across layers it is sequential: {H}'s keys read what layer 0 "
        f"wrote, so "
        f"layer 0 must finish first. That is why induction needs two layers: the one-layer "
        f"model has the same heads but no later head to read their output.\n\n"
        f"**Why do we need the output projection?** `W_O` decides *where in the stream* a "
        f"head writes. {P}'s `W_O` writes the previous token into a subspace that "
        f"{H}'s `W_K` reads, and its K-composition score measures exactly that overlap "
        f"(`{k_score:.2f}` against `{base:.2f}` for unrelated matrices). Without a "
        f"per-head `W_O` the heads could not choose which later heads read them.",
        "## Thresholds\n\n" + "\n".join(f"- {t}" for t in r.threshold_notes),
    ]
    path = out / "report.md"
    path.write_text("\n\n".join(sections) + "\n")
    return path
