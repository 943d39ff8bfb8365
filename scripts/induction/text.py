"""The Markdown of `scripts/induction`'s report, from its measurements.

Written for a reader of `scripts/worklog.py` (the executable notes this project started
from): it uses their notation (`x @ W_Q`, the attention weights, `W_OV = W_V @ W_O`) and
ends by answering their three questions. Every sentence that states a finding is chosen
by the measurement, so that a finding that fails reads as failed.
"""

from pathlib import Path

from analysis.induction import MAJORITY


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


def heldout_bump(history: dict, window: tuple[int, int]) -> tuple[float, float]:
    """The held-out loss's largest rise inside `window` (above its lowest value so far in
    the window), and the typical change between consecutive evaluations outside it."""
    steps, loss = history["step"], history["heldout_loss"]
    inside = [v for s, v in zip(steps, loss, strict=True) if window[0] <= s <= window[1]]
    rise = max(v - min(inside[: i + 1]) for i, v in enumerate(inside)) if inside else 0.0
    outside = [
        abs(b - a)
        for (s, a), b in zip(zip(steps, loss, strict=True), loss[1:], strict=False)
        if not window[0] <= s <= window[1] and s > steps[len(steps) // 2]
    ]
    noise = sorted(outside)[len(outside) // 2] if outside else 0.0
    return rise, noise


def _model_section(r: object) -> str:
    cfg = r.config
    norms = "no layer norms" if cfg.normalization_type is None else "layer norms"
    return (
        f"## The model, in the worklog's notation\n\n"
        f"`bytes-attn-only-2l` reads UTF-8 bytes (`<bos>` first), has two layers of "
        f"{cfg.n_heads} attention heads (`d_head` {cfg.d_head}) on a {cfg.d_model}-wide "
        f"residual stream, {norms}, and no MLPs; its weights were initialised with standard "
        f"deviation {cfg.init_range:.3g}. It was trained for {r.steps} steps on the Python "
        f"standard library's own source, half of each batch being repeated random bytes "
        f"(`{r.command}`). The worklog's step 1-7 is one of its attention sub-layers: with "
        f"the rows `x` of the residual stream,\n\n"
        f"    scores  = (x @ W_Q[h]) @ (x @ W_K[h]).T / sqrt(d_head)  # QK: where to look\n"
        f"    weights = softmax(causal_mask(scores))\n"
        f"    out     = weights @ (x @ W_V[h]) @ W_O[h]               # OV: what to move\n"
        f"    x       = x + sum over heads h of out                   # the stream\n\n"
        f"Row vectors throughout: `QK = W_Q @ W_K.T` and `OV = W_V @ W_O` (`d_model x "
        f"d_model`, rank {cfg.d_head}). The circuits below are read from the weights "
        f"through `process_weights`"
        + (
            ", which for a model without norms changes nothing: the weights are the circuit."
            if cfg.normalization_type is None
            else ", the layer norms folded in, so a norm's only remaining effect is one "
            "positive scale per token, which changes no argmax within a row."
        )
    )


def _heads_section(r: object, P: str, H: str) -> str:
    c, heads = r.circuit, r.circuit.heads
    p, h = c.prev_head, c.induction_head
    score = heads.prev_scores[0, p]
    offsets = ", ".join(f"{v:.2f}" for v in c.prev_offsets)
    strict = score > MAJORITY
    others = sorted(heads.prev_scores.scores[0].tolist(), reverse=True)[1]
    prev_text = (
        f"**{P}, its previous-token partner**, puts {score:.2f} of its attention on the "
        f"previous token (uniform causal attention: {heads.prev_scores.baseline:.3f}), a "
        f"majority: the strict finding of the papers holds. Its attention to the token 0, "
        f"1, 2, 3, 4 positions back is {offsets}. The next best previous-token head of "
        f"layer 0 scores {others:.2f}."
        if strict
        else f"**{P}, its previous-token partner**, is a *soft* previous-token head: its "
        f"attention to the token 0, 1, 2, 3, 4 positions back is {offsets}, and its "
        f"previous-token score ({score:.2f}; uniform {heads.prev_scores.baseline:.3f}) "
        f"holds no majority, so the strict finding of the papers does not hold on this "
        f"model."
    )
    induction = heads.induction_heads()
    return (
        f"## Two heads\n\n"
        f"![attention on a repeated sequence](attention_patterns.png)\n\n"
        f"To explore every head on this sequence (`<bos>` and 20 random characters, twice), "
        f"open [attention.html](attention.html) in a browser (self-contained, offline): hover "
        f"a token to see what it attends to.\n\n"
        f"![head scores](head_scores.png)\n\n"
        f"**{H}, the strongest induction head**, puts {heads.induction[1, h]:.2f} of its "
        f"attention on the token *after* an earlier copy of the query token (uniform causal "
        f"attention: {heads.induction.baseline:.3f}): in the figure, the stripe in the "
        f"second half, one position right of where the current token appeared before. In "
        f"the first half there is no earlier copy, and it rests on `<bos>`. "
        f"{len(induction)} of the {r.config.n_heads} layer-1 heads score above "
        f"{MAJORITY} ({', '.join(f'L1H{i}' for i in induction) or 'none'}).\n\n" + prev_text
    )


def _ablation_row(label: str, losses: object, clean_icl: float) -> list[object]:
    second = f"{losses.second:.3f} **(> ln 256)**" if losses.above_uniform else losses.second
    removed = f"{1 - losses.icl / clean_icl:.0%}"
    return [label, losses.first, second, losses.icl, removed]


def _ablation_rows(c: object) -> list[list[object]]:
    rows = [_ablation_row(f"L1H{h}, zero", a, c.clean.icl) for h, a in sorted(c.ablated.items())]
    for method, losses in c.ablated_all.items():
        rows.append(_ablation_row(f"all induction heads, {method}", losses, c.clean.icl))
    return rows


def _ablation_section(r: object) -> str:
    c = r.circuit
    broken = [losses for losses in c.ablated_all.values() if losses.above_uniform]
    verdict = (
        "With every induction head ablated, the second copy's loss ends above ln 256 = "
        "5.55 (marked): worse than knowing nothing where the intact model's context helps. "
        "That ablation breaks the model, beyond removing its in-context learning, and its "
        "share removed overstates what the heads do."
        if broken
        else "With every induction head ablated, the second copy's loss stays at or below "
        "ln 256 = 5.55 by either method: the ablation removes the in-context learning "
        "without breaking the model. (On the first copy even the intact model loses "
        f"{c.clean.first:.2f}, a little more than ln 256: it expects text, not random bytes.)"
    )
    return (
        "## Removing the induction heads\n\n"
        "Both ablations keep every attention pattern at its clean value (Olsson et al. "
        "2022's pattern-preserving ablation), so that what is removed is the heads' writes "
        "alone. *Zero* sets the heads' outputs to 0 (each head alone, then all induction "
        "heads together); *mean*, the control, sets them to their "
        "mean over 32 other random repeated sequences, position by position, so that what "
        "the heads write on every sequence stays and only what is specific to this one "
        f"goes. The in-context learning of the clean model is {c.clean.icl:.2f} nats "
        f"(first copy {c.clean.first:.2f}, second {c.clean.second:.2f}).\n\n"
        + _table(
            ["ablated, method", "first copy", "second copy", "ICL", "share of ICL removed"],
            _ablation_rows(c),
        )
        + f"\n\n{verdict}"
    )


def _dynamics_section(r: object) -> str:
    """Over training: the checkpoints' table, then when each measure rises."""
    d = r.dynamics
    same = r.induction_window == r.icl_window
    rows = zip(d.steps, d.induction, d.repeat_icl, d.text_icl, d.heldout, strict=True)
    spacing = sorted({b - a for a, b in zip(d.steps, d.steps[1:], strict=False)})[0]
    return (
        "## When the circuit forms\n\n"
        "![training dynamics](training_dynamics.png)\n\n"
        + _table(
            [
                "checkpoint step",
                "best L1 induction score",
                "repeat ICL",
                "text ICL (128 windows)",
                "held-out loss (128 windows)",
            ],
            [list(row) for row in rows],
        )
        + f"\n\nOn the {len(d.steps)} shipped checkpoints ({spacing} steps apart through the "
        f"change, and the final model), the induction score rises the most between steps "
        f"{r.induction_window[0]} and {r.induction_window[1]}, the in-context learning "
        f"between {r.icl_window[0]} and {r.icl_window[1]}"
        + (" (the same window). " if same else " (not the same window). ")
        + _history_text(r)
    )


def _history_text(r: object) -> str:
    """What the run's own evaluations show about the timing, chosen by the measurement."""
    d = r.dynamics
    interval = d.history["step"][1] - d.history["step"][0]
    rise, noise = heldout_bump(d.history, r.history_window)
    bump = (
        f"Within that window the held-out loss rises by up to {rise:.3f} nats above its "
        f"lowest value so far, against a typical change of {noise:.3f} between consecutive "
        f"evaluations later in training: a small *induction bump* (lower panel)."
        if rise > 2 * noise and rise > 0.005
        else f"Within that window the held-out loss rises by at most {rise:.3f} nats "
        f"(typical change between consecutive evaluations later on: {noise:.3f}): no "
        f"induction bump beyond the noise (lower panel)."
    )
    window = (
        f"The in-context learning rises from 20% to 80% of its rise between steps "
        f"{r.history_window[0]} and {r.history_window[1]} (shaded) in the run's own "
        f"evaluations, every {interval} steps (lines in the figure). {bump} "
    )
    if r.history_half is None:
        return window + "This run did not evaluate the induction score (an older run)."
    induction, icl = r.history_half
    together = abs(induction - icl) <= interval
    first = "the in-context learning" if icl < induction else "the best head's score"
    timing = (
        f"The best induction score passes half of its rise at step {induction}, the "
        f"in-context learning at step {icl}: "
        + (
            "within one evaluation of each other, so the two rise together, as Olsson et al. found."
            if together
            else f"{abs(induction - icl)} steps apart, more than one evaluation, so on this "
            f"criterion they do *not* rise together: both rise in the same few hundred "
            f"steps, but {first} leads."
        )
    )
    return (
        window + timing + " The evaluations show *when*, not *why*: that the heads cause the "
        "in-context learning is the ablation's evidence, above."
    )


def _smaller_models_section(r: object) -> str:
    zero = r.text["bytes-attn-only-0l"].mean
    return (
        f"## The smaller models\n\n"
        f"**0 layers.** With no attention, the logits depend on the current token alone: "
        f"the model can at best learn the bigram table. Its held-out loss is {zero:.3f} nats "
        f"over every prediction of the {r.n_windows} held-out windows (the training run's "
        f"last evaluation, on 64 of them, gave {r.zero_layer_training_loss:.3f}: that is the "
        f"number `list_pretrained()` shows). On the predictions after the first byte, where "
        f"a bigram table applies (the one right after `<bos>` has no previous byte), it is "
        f"{r.bigram.model_loss:.3f}; the bigram table of the training files gives "
        f"{r.bigram.bigram_loss:.3f} on the same predictions and the unigram table "
        f"{r.bigram.unigram_loss:.3f}, so it captures {r.bigram.share:.0%} of what the "
        f"previous byte tells about the next.\n\n"
        f"**1 layer.** Copying scores of its heads' full OV circuits: "
        + ", ".join(f"H{i} {v:.2f}" for i, v in enumerate(r.one_layer_copying.scores[0].tolist()))
        + f" (random: 0 ± {r.one_layer_copying.baseline_std:.2f}); "
        f"{r.n_copying}/{r.one_layer_copying.scores.shape[1]} are copying heads: attending "
        f"to a byte raises that byte's logit. On random bytes, where attending to any "
        f"earlier byte is a guess, that is worth little: {r.one_layer.second:.2f} nats on "
        f"the second copy."
    )


def _icl_section(r: object) -> str:
    """In-context learning on repeated bytes and held-out text."""
    c = r.circuit
    return (
        "## In-context learning\n\n"
        f"![loss by position](icl_curve.png)\n\n"
        f"On `<bos>` + 63 random bytes + the same 63 bytes again, the two-layer model's loss "
        f"on the first copy is {c.clean.first:.2f} nats (ln 256 = 5.55: nothing to learn) "
        f"and on the second copy {c.clean.second:.2f}, a repeat ICL of {c.clean.icl:.2f}. "
        f"A model that knew *which* bytes occurred but not in what order could get to "
        f"{c.clean.order_blind:.2f} (each byte predicted by its frequency in the first "
        f"copy). The one-layer model gets {r.one_layer.second:.2f} on the second copy, "
        f"{r.one_layer.first:.2f} on the first: without a second layer its heads cannot "
        f"find the byte that came *next* last time. On held-out stdlib files the two-layer "
        f"model's text ICL is {r.text_icl.icl:+.3f} ± {r.text_icl.icl_stderr:.3f} nats "
        f"(standard error over {r.n_windows} windows): identifiers and phrases recur within "
        f"a file."
    )


def _qk_section(r: object) -> str:
    """The induction head's QK circuit: K-composition with the previous-token head."""
    c, heads = r.circuit, r.circuit.heads
    p, h = c.prev_head, c.induction_head
    P, H = f"L0H{p}", f"L1H{h}"
    k_score, q_score, v_score = (heads.composition_of_pair(kind) for kind in "KQV")
    k = heads.composition["K"]
    partners = heads.k_partners()
    sharp = heads.prev_scores[0, p] > MAJORITY
    layer_pairs = {kind: heads.composition[kind].scores[0, :, 1, :] for kind in "QKV"}
    pair_means = {kind: float(v.mean()) for kind, v in layer_pairs.items()}
    n_pairs = layer_pairs["K"].numel()
    return (
        "## The QK circuit of the induction head: K-composition\n\n"
        f"![composition scores](composition.png)\n\n"
        f"{H} must attend to the key *after* an earlier copy of the query token. The key's "
        f"own token says nothing about that; what identifies it is the token *before* it. "
        f"{P} moves that token: at position j it attends "
        + ("to j-1" if sharp else "mostly to j-1 (with some weight further back)")
        + f" and writes `x[j-1] @ OV_{P}` into the stream. {H} reads its keys from the "
        f"stream through "
        f"`W_K`, so its keys can contain the previous token. How much of what {P} writes "
        f"{H}'s keys read is the K-composition score: the Frobenius norm of the product "
        f"`OV_{P} @ QK_{H}.T` relative to the norms of the two (Elhage et al. 2021):\n\n"
        f"    K-composition({P} -> {H}) = {k_score:.3f}  (random: {k.baseline:.3f} ± "
        f"{k.baseline_std:.3f}; 2/sqrt(d_model) = {r.composition_floor:.3f})\n"
        f"    Q-composition({P} -> {H}) = {q_score:.3f}\n"
        f"    V-composition({P} -> {H}) = {v_score:.3f}\n\n"
        f"The random baseline is that of Gaussian matrices of these shapes, the same for "
        f"the three kinds; each panel of the figure also gives the mean and spread of its "
        f"own {n_pairs} pairs: "
        + ", ".join(f"{kind} {mean:.3f}" for kind, mean in pair_means.items())
        + f" on average. {P} is {H}'s strongest K-composition partner; "
        f"{len(partners)} layer-0 head{'s' if len(partners) != 1 else ''} compose with it "
        f"well above random ({', '.join(f'L0H{i}' for i in partners) or 'none'}). "
        f"Causally, with patterns recomputed: zeroing {P}'s output lowers {H}'s induction "
        f"score from {heads.induction[1, h]:.2f} to {c.induction_without_prev:.2f}; zeroing "
        f"all of its K-composition partners lowers it to "
        f"{c.induction_without_partners:.2f}.\n\n" + _qk_token_space(r)
    )


def _qk_token_space(r: object) -> str:
    """The QK circuits composed in token and position space: the mechanism."""
    c = r.circuit
    P, H = f"L0H{c.prev_head}", f"L1H{c.induction_head}"
    return (
        f"Composing the circuits in token space shows the mechanism: the matrix "
        f"`W_E @ QK_{H} @ (W_E @ OV_{P}).T` gives the attention score of a query byte "
        f"(rows) for a key whose *previous* byte is the column byte. Its largest entry in a "
        f"row is on the diagonal for {c.qk_match:.0%} of the printable bytes (chance: "
        f'1/95 = 1.1%): the query asks "was the token before you the same as me?". The '
        f"direct path `W_E @ QK_{H} @ W_E.T`, without {P}, peaks there for "
        f"{c.qk_direct_match:.0%} (upper right and lower left panels).\n\n"
        f"![circuits](circuits.png)\n\n"
        f"{P}'s own QK circuit is positional: `W_pos @ QK_{P} @ W_pos.T` (upper left) "
        f"favours recent keys, and peaks exactly one back for {c.prev_position:.0%} of "
        f"query positions."
    )


def _ov_section(r: object) -> str:
    """The induction head's OV circuit: copying."""
    c = r.circuit
    H = f"L1H{c.induction_head}"
    return (
        "## The OV circuit of the induction head: copying\n\n"
        f"![direct logit attribution](logit_attribution.png)\n\n"
        f'Once {H} attends to the right key, its OV circuit must turn "I am looking at '
        f'byte b" into "predict b". The full OV circuit `W_E @ OV_{H} @ W_U` (lower right '
        f"above) has its largest logit on the diagonal for {c.ov_copy:.0%} of printable "
        f"bytes, and its copying score (sum of eigenvalues over sum of their absolute "
        f"values) is {c.copying.scores[1, c.induction_head]:.2f} (random: 0 ± "
        f"{c.copying.baseline_std:.2f}). Direct logit attribution agrees: on the second "
        f"copy, {H} adds {c.attribution[H]:+.2f} to the correct byte's logit on average; "
        f"on the first copy it adds {c.attribution_first[H]:+.2f}."
    )


def _questions_section(r: object) -> str:
    """Answers to the worklog's three questions."""
    c, heads = r.circuit, r.circuit.heads
    P, H = f"L0H{c.prev_head}", f"L1H{c.induction_head}"
    k_score, k = heads.composition_of_pair("K"), heads.composition["K"]
    sharp = heads.prev_scores[0, c.prev_head] > MAJORITY
    looks = "the previous position" if sharp else "the last few positions, the previous one most"
    return (
        "## The worklog's questions\n\n"
        f"**What is the attention weight trying to tell us?** Which earlier position this "
        f"head moves information *from*, and nothing about what it moves. {P}'s weights say "
        f'"{looks}", for every token alike; {H}\'s say "the position after '
        f'an earlier copy of me", a question about *content* that it can only ask because '
        f"{P} has already written each token's predecessor into the stream.\n\n"
        f"**What happens in parallel, what in sequence?** Within a layer everything is "
        f"parallel: all positions, and all {r.config.n_heads} heads, read the same stream "
        f"and add their outputs to it. Across layers it is sequential: {H}'s keys read what "
        f"layer 0 wrote, so layer 0 must finish first. That is why induction needs two "
        f"layers: the one-layer model has the same heads but no later head to read their "
        f"output.\n\n"
        f"**Why do we need the output projection?** `W_O` decides *where in the stream* a "
        f"head writes. {P}'s `W_O` writes the previous token into a subspace that {H}'s "
        f"`W_K` reads, and its K-composition score measures exactly that overlap "
        f"(`{k_score:.3f}` against `{k.baseline:.3f}` for unrelated matrices). Without a "
        f"per-head `W_O` the heads could not choose which later heads read them."
    )


def write_report(out: Path, r: object) -> Path:
    """Write `report.md` into `out` from the measurements `r` (see `main` in `__main__.py`)."""
    c = r.circuit
    P, H = f"L0H{c.prev_head}", f"L1H{c.induction_head}"
    sections = [
        f"# How `bytes-attn-only-2l` does induction\n\n"
        f"Written by `python scripts/induction` in {r.seconds:.0f} s of wall "
        f"time ({r.cpu_seconds:.0f} s of CPU) from the shipped models "
        f"(`HookedTransformer.from_pretrained`), torch {r.torch_version}. Every number "
        f"below is measured by that run; every threshold is stated against a baseline "
        f"(section *Thresholds*), and `tests/shipped/test_induction_findings.py` checks the same "
        f"ones with the same code (`analysis.induction`).\n\n"
        f"*In-context learning* (ICL) is, everywhere below, the loss with less context minus "
        f"the loss with more, in nats per token: first copy minus second copy of a repeated "
        f"sequence (*repeat ICL*), early minus late positions of held-out text (*text ICL*: "
        f"tokens 9-24 minus tokens 97-127). Positive means the context helps. (Olsson et "
        f"al. 2022's in-context-learning score is the text ICL's negative.)",
        "## Findings\n\n" + findings_table(r.findings),
        _model_section(r),
        _icl_section(r),
        _heads_section(r, P, H),
        _qk_section(r),
        _ov_section(r),
        _ablation_section(r),
        _dynamics_section(r),
        _smaller_models_section(r),
        _questions_section(r),
        "## Thresholds\n\n" + "\n".join(f"- {t}" for t in r.threshold_notes),
    ]
    path = out / "report.md"
    path.write_text("\n\n".join(sections) + "\n")
    return path
