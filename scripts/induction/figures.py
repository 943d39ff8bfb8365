"""The figures of `scripts/induction` (matplotlib, Agg backend: no display needed).

Each function draws one PNG into `out` and returns its file name. Sized for a page (about
7 inches wide at 150 dpi), with every axis and colour bar labelled. Colours follow
`analysis.plots`: signed values blue for positive and red for negative around a white 0,
non-negative ones white to blue; each model keeps one line colour in every figure.
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from torch import Tensor

from analysis.plots import SIGNED_CMAP, UNSIGNED_CMAP

DPI = 150
TICK_SIZE = 7
MODEL_COLOURS = {  # one colour per model, in every figure
    "bytes-attn-only-1l": "C1",
    "bytes-attn-only-2l": "C0",
    "bytes-attn-only-0l": "C7",
    "bytes-gelu-2l": "C4",
}
ABLATED_COLOUR = "C3"


def _save(fig: plt.Figure, out: Path, name: str) -> str:
    fig.savefig(out / name, dpi=DPI)
    plt.close(fig)
    return name


def _image(ax: plt.Axes, values: Tensor, title: str, **kwargs: object) -> object:
    image = ax.imshow(values.detach().float().numpy(), aspect="auto", **kwargs)
    ax.set_title(title, fontsize=9)
    ax.tick_params(labelsize=TICK_SIZE)
    return image


def _annotate(ax: plt.Axes, values: Tensor, vmax: float, size: int = 7, digits: int = 2) -> None:
    """Each cell's value, white on dark cells so that it stays readable."""
    rows, cols = values.shape
    for r in range(rows):
        for c in range(cols):
            value = float(values[r, c])
            ink = "white" if abs(value) > 0.6 * vmax else "black"
            ax.text(c, r, f"{value:.{digits}f}", ha="center", va="center", fontsize=size, color=ink)


def _outline(ax: plt.Axes, row: int, col: int) -> None:
    ax.add_patch(plt.Rectangle((col - 0.5, row - 0.5), 1, 1, fill=False, ec="black", lw=2))


def attention_patterns(
    out: Path, patterns: dict[str, Tensor], labels: list[str], period: int
) -> str:
    """The circuit's two heads attending over one repeated sequence."""
    fig, axes = plt.subplots(1, len(patterns), figsize=(11, 5.2), layout="constrained")
    for ax, (title, pattern) in zip(axes, patterns.items(), strict=True):
        image = _image(ax, pattern, title, cmap=UNSIGNED_CMAP, vmin=0, vmax=1)
        ticks = range(len(labels))
        # Vertical key labels: `<bos>` is wider than a cell and would cover its neighbours.
        ax.set_xticks(ticks, labels, fontsize=6, family="monospace", rotation=90)
        ax.set_yticks(ticks, labels, fontsize=6, family="monospace")
        ax.set_xlabel("key (attended) token", fontsize=8)
        ax.set_ylabel("query token", fontsize=8)
        ax.axhline(period + 0.5, color="black", lw=0.6, ls="--")
        ax.axvline(period + 0.5, color="black", lw=0.6, ls="--")
        fig.colorbar(image, ax=ax, shrink=0.8).set_label("attention weight", fontsize=8)
    return _save(fig, out, "attention_patterns.png")


def head_scores(out: Path, panels: list[tuple[str, Tensor, bool]], circuit: dict) -> str:
    """Heatmaps `[layer head]` of each head score; `signed` panels get a -1..1 scale."""
    fig, axes = plt.subplots(len(panels), 1, figsize=(7, 1.9 * len(panels)), layout="constrained")
    for ax, (title, scores, signed) in zip(axes, panels, strict=True):
        cmap, vmin = (SIGNED_CMAP, -1.0) if signed else (UNSIGNED_CMAP, 0.0)
        image = _image(ax, scores, title, cmap=cmap, vmin=vmin, vmax=1.0)
        n_layers, n_heads = scores.shape
        ax.set_xticks(range(n_heads), [f"H{h}" for h in range(n_heads)])
        ax.set_yticks(range(n_layers), [f"L{layer}" for layer in range(n_layers)])
        # Three decimals: the report compares these scores with thresholds such as 0.5, and
        # 0.502 must not read as 0.50.
        _annotate(ax, scores, 1.0, size=6, digits=3)
        for layer, head in circuit.values():
            _outline(ax, layer, head)
        fig.colorbar(image, ax=ax).set_label("score", fontsize=8)
    axes[-1].set_xlabel("head", fontsize=8)
    return _save(fig, out, "head_scores.png")


def composition(
    out: Path, panels: list[tuple[str, Tensor]], pair: tuple[int, int], suptitle: str
) -> str:
    """Q-, K-, V-composition of layer-0 heads (rows) into layer-1 heads (columns)."""
    vmax = max(float(p.max()) for _, p in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(11, 4.0), layout="constrained")
    for ax, (title, scores) in zip(axes, panels, strict=True):
        image = _image(ax, scores, title, cmap=UNSIGNED_CMAP, vmin=0, vmax=vmax)
        n = scores.shape[0]
        ax.set_xticks(range(n), [f"L1H{h}" for h in range(n)], rotation=45)
        ax.set_yticks(range(n), [f"L0H{h}" for h in range(n)])
        ax.set_xlabel("reading head (layer 1)", fontsize=8)
        prev, head = pair
        _outline(ax, prev, head)
        _annotate(ax, scores, vmax, size=6)
    axes[0].set_ylabel("writing head (layer 0)", fontsize=8)
    fig.colorbar(image, ax=list(axes), shrink=0.9).set_label("composition score", fontsize=8)
    fig.suptitle(suptitle, fontsize=9)
    return _save(fig, out, "composition.png")


def logit_attribution(out: Path, second: dict[str, float], first: dict[str, float]) -> str:
    """Mean direct attribution to the correct next token, per component, both copies."""
    labels = sorted(second, key=lambda k: -abs(second[k]))[:14][::-1]
    fig, ax = plt.subplots(figsize=(7, 4.6), layout="constrained")
    y = torch.arange(len(labels)).float()
    ax.barh(y + 0.2, [second[k] for k in labels], 0.4, color="C0", label="second copy (repeat)")
    ax.barh(y - 0.2, [first[k] for k in labels], 0.4, color="C7", label="first copy (random)")
    ax.set_yticks(y.tolist(), labels, fontsize=TICK_SIZE)
    ax.axvline(0, color="black", lw=0.6)
    ax.set_xlabel("mean direct contribution to the correct token's logit")
    ax.set_ylabel("component (14 largest on the second copy)")
    ax.legend(fontsize=8)
    return _save(fig, out, "logit_attribution.png")


def icl_curves(
    out: Path,
    repeat: dict[str, tuple[Tensor, str]],
    text: dict[str, Tensor],
    lines: dict[str, tuple[float, str]],
) -> str:
    """Loss by position: on repeated random sequences, and on held-out text.

    `repeat` maps a label to a curve and its colour; `lines` a label to a level and its
    line style. The reference lines are in the legend, where curves cannot hide them.
    """
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    for name, (curve, colour) in repeat.items():
        left.plot(range(1, len(curve) + 1), curve.numpy(), label=name, lw=1, color=colour)
    for name, (value, style) in lines.items():
        left.axhline(value, ls=style, lw=1, color="gray", label=name)
    left.set_title("repeated random bytes: <bos>, 63 bytes, the same 63 again", fontsize=9)
    left.set_xlabel("position of the predicted token")
    left.set_ylabel("loss (nats)")
    # Below the axes: inside, it would hide the reference lines or the drop at the repeat.
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    kernel = torch.ones(1, 1, 5) / 5  # a 5-token moving average: the curves are noisy
    for name, curve in text.items():
        smooth = torch.nn.functional.conv1d(curve[None, None].float(), kernel)[0, 0]
        right.plot(
            range(3, len(smooth) + 3), smooth.numpy(), label=name, lw=1, color=MODEL_COLOURS[name]
        )
    right.set_title("held-out stdlib files (5-token moving average)", fontsize=9)
    right.set_xlabel("position of the predicted token")
    right.set_ylabel("loss (nats)")
    right.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2)
    return _save(fig, out, "icl_curve.png")


_CIRCUIT_LABELS = {  # key -> (x label, y label, colour bar label)
    "positional": ("key position", "query position", "attention score"),
    "composed": ("byte before the key", "query byte", "attention score"),
    "direct": ("key byte", "query byte", "attention score"),
    "ov": ("logit of byte", "attended byte", "logit"),
}


def circuits(out: Path, matrices: dict[str, Tensor], titles: dict[str, str], chars: str) -> str:
    """The two heads' circuits, two by two: positional QK, composed QK, direct QK, OV."""
    fig, axes = plt.subplots(2, 2, figsize=(10, 9.6), layout="constrained")
    for ax, key in zip(axes.flat, ("positional", "composed", "direct", "ov"), strict=True):
        values, title = matrices[key], titles[key]
        limit = float(values.abs().max())
        if key == "positional":
            values = values[:32, :32].masked_fill(~torch.ones(32, 32, dtype=torch.bool).tril(), 0)
            # The first few positions (`<bos>` and its neighbours) score several times more
            # than the rest, and would set a scale on which the previous-token diagonal is
            # faint: the scale is set by the queries from position 4 on, the first ones
            # saturate, and the title says so.
            limit = float(values[4:].abs().max())
            title = (
                f"{title}\nscale set by queries 4-31; queries 0-3 reach {values.abs().max():.0f}"
            )
        else:
            ticks = range(0, len(chars), 4)
            ax.set_xticks(ticks, [chars[i] for i in ticks], family="monospace")
            ax.set_yticks(ticks, [chars[i] for i in ticks], family="monospace")
        image = _image(ax, values, title, cmap=SIGNED_CMAP, vmin=-limit, vmax=limit)
        x_label, y_label, bar_label = _CIRCUIT_LABELS[key]
        ax.set_xlabel(x_label, fontsize=8)
        ax.set_ylabel(y_label, fontsize=8)
        fig.colorbar(image, ax=ax, shrink=0.85).set_label(bar_label, fontsize=8)
    return _save(fig, out, "circuits.png")


def training_dynamics(out: Path, d: object, window: tuple[int, int]) -> str:
    """Over training: the induction score and ICL (top), the held-out loss (bottom).

    `d` is the report's `Dynamics`; lines are the run's own evaluations, markers the
    shipped checkpoints; `window` (shaded) is where the ICL rises from 20% to 80%.
    """
    history = d.history
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(7, 6.4), sharex=True, layout="constrained", height_ratios=(3, 2)
    )
    icl = [a - b for a, b in zip(history["repeat_first"], history["repeat_second"], strict=True)]
    top.plot(history["step"], icl, color="C0", lw=1, label="repeat ICL (first minus second copy)")
    top.plot(d.steps, d.repeat_icl, "o", color="C0", ms=4, label="repeat ICL (checkpoints)")
    text_icl = [-v for v in history["icl_score"]]
    top.plot(history["step"], text_icl, color="C2", lw=1, label="text ICL (early minus late)")
    top.set_ylabel("ICL (nats)")
    right = top.twinx()
    if d.history_has_induction():
        right.plot(history["step"], history["induction"], color="C3", lw=1, label="induction score")
    right.plot(d.steps, d.induction, "s", color="C3", ms=4, label="induction score (checkpoints)")
    right.set_ylabel("induction score (best head)", color="C3")
    right.set_ylim(0, 1)
    window_patch = top.axvspan(*window, color="gold", alpha=0.25, lw=0)
    window_patch.set_label("ICL rising from 20% to 80% of its rise")
    handles = top.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    top.legend(handles=handles, fontsize=7, loc="center right")
    top.set_title(
        "bytes-attn-only-2l over training (lines: the run's evaluations; markers: shipped "
        "checkpoints)",
        fontsize=8,
    )
    bottom.plot(
        history["step"],
        history["heldout_loss"],
        color="C7",
        lw=1,
        label="run's evaluations (64 windows)",
    )
    bottom.plot(
        d.steps, d.heldout, "o", color="k", ms=4, label="shipped checkpoints (128 other windows)"
    )
    bottom.legend(fontsize=7)
    # The first evaluations (loss near ln 256) would flatten the rest, the bump included:
    # a log scale keeps every evaluation on the axis and the bump visible.
    bottom.set_yscale("log")
    losses = history["heldout_loss"]
    bottom.set_ylim(min(losses) * 0.97, max(losses) * 1.05)
    ticks = [
        t
        for t in (1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0)
        if min(losses) * 0.97 <= t <= max(losses) * 1.05
    ]
    bottom.set_yticks(ticks, [f"{t:g}" for t in ticks])
    bottom.minorticks_off()
    bottom.set_ylabel("held-out loss (nats)")
    bottom.set_xlabel("training step")
    bottom.axvspan(*window, color="gold", alpha=0.25, lw=0)
    return _save(fig, out, "training_dynamics.png")


PRINTABLE = "".join(map(chr, range(32, 127)))


def draw_all(out: Path, model: object, r: object, text: dict[str, Tensor]) -> None:
    """Every figure of the report, from the measurements `r` of `main` in `__main__.py`."""
    _draw_attention(out, model, r)
    _draw_scores(out, r)
    _draw_losses_and_circuits(out, r, text)


FIGURE_PERIOD = 20


def figure_prompt() -> Tensor:
    """`<bos>` and 20 random visible characters, twice: the attention figure's prompt, and
    the attention page's, so that the page shows the sequence the figure and text describe."""
    generator = torch.Generator().manual_seed(1)
    segment = torch.randint(33, 127, (FIGURE_PERIOD,), generator=generator)
    return torch.cat([torch.tensor([256]), segment, segment])[None]


def _draw_attention(out: Path, model: object, r: object) -> None:
    c = r.circuit
    p, h = c.prev_head, c.induction_head
    short = figure_prompt()
    with torch.no_grad():
        _, cache = model.run_with_cache(short, names_filter=lambda n: "pattern" in n)
    labels = ["<bos>"] + [chr(int(t)) for t in short[0, 1:]]
    attention_patterns(
        out,
        {
            f"L0H{p}: previous-token head": cache["pattern", 0][0, p],
            f"L1H{h}: induction head": cache["pattern", 1][0, h],
        },
        labels,
        period=FIGURE_PERIOD,
    )


def _draw_scores(out: Path, r: object) -> None:
    c = r.circuit
    p, h = c.prev_head, c.induction_head
    prev, induction = c.heads.prev_scores, c.heads.induction
    head_scores(
        out,
        [
            (f"previous-token score (uniform attention: {prev.baseline:.3f})", prev.scores, False),
            (
                f"induction score (uniform attention: {induction.baseline:.3f})",
                induction.scores,
                False,
            ),
            (
                f"OV copying score, -1..1 (random: 0 ± {c.copying.baseline_std:.2f})",
                c.copying.scores,
                True,
            ),
        ],
        {"prev": (0, p), "induction": (1, h)},
    )
    composition_panels = []
    for kind in "QKV":
        scores = c.heads.composition[kind].scores[0, :, 1, :]
        composition_panels.append(
            (
                f"{kind}-composition ({scores.numel()} pairs: "
                f"{scores.mean():.3f} ± {scores.std():.3f})",
                scores,
            )
        )
    k = c.heads.composition["K"]
    composition(
        out,
        composition_panels,
        (p, h),
        f"random Gaussian matrices of these shapes score {k.baseline:.3f} ± {k.baseline_std:.3f} "
        f"(every kind); 2/sqrt(d_model) = {r.composition_floor:.3f}; outlined: L0H{p} -> L1H{h}",
    )


def _draw_losses_and_circuits(out: Path, r: object, text: dict[str, Tensor]) -> None:
    c = r.circuit
    p, h = c.prev_head, c.induction_head
    logit_attribution(out, c.attribution, c.attribution_first)
    two = "bytes-attn-only-2l"
    icl_curves(
        out,
        {
            "bytes-attn-only-1l": (r.one_layer.per_position, MODEL_COLOURS["bytes-attn-only-1l"]),
            two: (c.clean.per_position, MODEL_COLOURS[two]),
            f"{two}, L1H{h} zero-ablated (patterns kept)": (
                c.ablated[h].per_position,
                ABLATED_COLOUR,
            ),
        },
        text,
        {"ln 256 = 5.55 (uniform)": (5.545, "--"), "order-blind bound": (c.clean.order_blind, ":")},
    )
    circuits(
        out,
        c.matrices,
        {
            "positional": f"L0H{p}: W_pos QK W_pos^T (first 32 positions)",
            "composed": f"L1H{h} through L0H{p}: W_E QK (W_E OV_L0H{p})^T",
            "direct": f"L1H{h} direct: W_E QK W_E^T",
            "ov": f"L1H{h}: W_E OV W_U",
        },
        PRINTABLE,
    )
    training_dynamics(out, r.dynamics, r.history_window)
