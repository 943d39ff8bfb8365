"""The figures of `scripts/induction_circuit.py` (matplotlib, Agg backend: no display needed).

Each function draws one PNG into `out` and returns its file name.
"""

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from torch import Tensor

DPI = 110


def _save(fig: plt.Figure, out: Path, name: str) -> str:
    fig.tight_layout()
    fig.savefig(out / name, dpi=DPI)
    plt.close(fig)
    return name


def _heatmap(ax: plt.Axes, values: Tensor, title: str, **kwargs: object) -> object:
    image = ax.imshow(values.detach().float().numpy(), aspect="auto", **kwargs)
    ax.set_title(title, fontsize=9)
    return image


def attention_patterns(
    out: Path, patterns: dict[str, Tensor], labels: list[str], period: int
) -> str:
    """The circuit's two heads attending over one repeated sequence."""
    fig, axes = plt.subplots(1, len(patterns), figsize=(6 * len(patterns), 5.4))
    for ax, (title, pattern) in zip(axes, patterns.items(), strict=True):
        image = _heatmap(ax, pattern, title, cmap="Blues", vmin=0, vmax=1)
        ticks = range(len(labels))
        ax.set_xticks(ticks, labels, fontsize=6, family="monospace")
        ax.set_yticks(ticks, labels, fontsize=6, family="monospace")
        ax.set_xlabel("key (attended) token")
        ax.set_ylabel("query token")
        ax.axhline(period + 0.5, color="red", lw=0.6)
        ax.axvline(period + 0.5, color="red", lw=0.6)
        fig.colorbar(image, ax=ax, shrink=0.8)
    return _save(fig, out, "attention_patterns.png")


def head_scores(out: Path, panels: list[tuple[str, Tensor, float]], circuit: dict) -> str:
    """Heatmaps `[layer head]` of each head score, its baseline in the title."""
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 2.6))
    for ax, (title, scores, vmax) in zip(axes, panels, strict=True):
        image = _heatmap(ax, scores, title, cmap="RdBu_r", vmin=-vmax, vmax=vmax)
        n_layers, n_heads = scores.shape
        ax.set_xticks(range(n_heads), [f"H{h}" for h in range(n_heads)])
        ax.set_yticks(range(n_layers), [f"L{layer}" for layer in range(n_layers)])
        for (layer, head), value in _cells(scores):
            ax.text(head, layer, f"{value:.2f}", ha="center", va="center", fontsize=7)
        for layer, head in circuit.values():
            ax.add_patch(plt.Rectangle((head - 0.5, layer - 0.5), 1, 1, fill=False, lw=2))
        fig.colorbar(image, ax=ax, shrink=0.8)
    return _save(fig, out, "head_scores.png")


def _cells(scores: Tensor) -> list[tuple[tuple[int, int], float]]:
    rows, cols = scores.shape
    return [((r, c), float(scores[r, c])) for r in range(rows) for c in range(cols)]


def composition(out: Path, panels: list[tuple[str, Tensor]], pair: tuple[int, int]) -> str:
    """Q-, K-, V-composition of layer-0 heads (rows) into layer-1 heads (columns)."""
    vmax = max(float(p.max()) for _, p in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.4))
    for ax, (title, scores) in zip(axes, panels, strict=True):
        image = _heatmap(ax, scores, title, cmap="viridis", vmin=0, vmax=vmax)
        n = scores.shape[0]
        ax.set_xticks(range(n), [f"L1H{h}" for h in range(n)], fontsize=7, rotation=45)
        ax.set_yticks(range(n), [f"L0H{h}" for h in range(n)], fontsize=7)
        prev, head = pair
        ax.add_patch(plt.Rectangle((head - 0.5, prev - 0.5), 1, 1, fill=False, ec="red", lw=2))
        for (row, col), value in _cells(scores):
            ax.text(col, row, f"{value:.2f}", ha="center", va="center", fontsize=6, color="w")
        fig.colorbar(image, ax=ax, shrink=0.8)
    return _save(fig, out, "composition.png")


def logit_attribution(out: Path, second: dict[str, float], first: dict[str, float]) -> str:
    """Mean direct attribution to the correct next token, per component, both copies."""
    labels = sorted(second, key=lambda k: -abs(second[k]))[:14][::-1]
    fig, ax = plt.subplots(figsize=(7, 5))
    y = torch.arange(len(labels)).float()
    ax.barh(y + 0.2, [second[k] for k in labels], height=0.4, label="second copy (predictable)")
    ax.barh(y - 0.2, [first[k] for k in labels], height=0.4, label="first copy (random)")
    ax.set_yticks(y.tolist(), labels)
    ax.axvline(0, color="black", lw=0.6)
    ax.set_xlabel("mean direct contribution to the correct token's logit")
    ax.legend(fontsize=8)
    return _save(fig, out, "logit_attribution.png")


def icl_curves(
    out: Path, repeat: dict[str, Tensor], text: dict[str, Tensor], lines: dict[str, float]
) -> str:
    """Loss by position: on repeated random sequences, and on held-out text."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    for name, curve in repeat.items():
        left.plot(range(1, len(curve) + 1), curve.numpy(), label=name, lw=1)
    for name, value in lines.items():
        left.axhline(value, ls="--", lw=0.8, color="gray")
        left.text(2, value + 0.05, name, fontsize=7, color="gray")
    left.set_title("repeated random bytes: <bos>, 63 bytes, the same 63 again", fontsize=9)
    left.set_xlabel("position of the predicted token")
    left.set_ylabel("loss (nats)")
    left.legend(fontsize=8)
    kernel = torch.ones(1, 1, 5) / 5  # a 5-token moving average: the curves are noisy
    for name, curve in text.items():
        smooth = torch.nn.functional.conv1d(curve[None, None].float(), kernel)[0, 0]
        right.plot(range(3, len(smooth) + 3), smooth.numpy(), label=name, lw=1)
    right.set_title("held-out stdlib files (5-token moving average)", fontsize=9)
    right.set_xlabel("position of the predicted token")
    right.legend(fontsize=8)
    return _save(fig, out, "icl_curve.png")


def circuits(out: Path, matrices: dict[str, Tensor], titles: dict[str, str], chars: str) -> str:
    """The two heads' circuits: positional QK, composed QK, direct QK, OV."""
    fig, axes = plt.subplots(1, 4, figsize=(22, 5.4))
    for ax, key in zip(axes, ("positional", "composed", "direct", "ov"), strict=True):
        values = matrices[key]
        if key == "positional":
            values = values[:32, :32].masked_fill(~torch.ones(32, 32, dtype=torch.bool).tril(), 0)
            ax.set_xlabel("key position")
            ax.set_ylabel("query position")
        else:
            ticks = range(0, len(chars), 4)
            ax.set_xticks(ticks, [chars[i] for i in ticks], fontsize=6, family="monospace")
            ax.set_yticks(ticks, [chars[i] for i in ticks], fontsize=6, family="monospace")
        limit = float(values.abs().max())
        image = _heatmap(ax, values, titles[key], cmap="RdBu_r", vmin=-limit, vmax=limit)
        fig.colorbar(image, ax=ax, shrink=0.8)
    return _save(fig, out, "circuits.png")


def training_dynamics(
    out: Path,
    history: dict[str, list[float]],
    steps: tuple[int, ...],
    induction: tuple[float, ...],
    repeat_icl: tuple[float, ...],
) -> str:
    """The run's evaluations over training, and the shipped checkpoints' induction scores."""
    fig, left = plt.subplots(figsize=(8, 4.2))
    icl = [a - b for a, b in zip(history["repeat_first"], history["repeat_second"], strict=True)]
    left.plot(history["step"], icl, color="C0", lw=1, label="ICL: first minus second copy loss")
    left.plot(steps, repeat_icl, "o", color="C0")
    left.plot(
        history["step"],
        [-v for v in history["icl_score"]],
        color="C2",
        lw=1,
        label="text ICL: early minus late loss (held-out)",
    )
    left.set_xlabel("training step")
    left.set_ylabel("nats")
    right = left.twinx()
    right.plot(steps, induction, "s-", color="C3", label="best L1 induction score")
    right.set_ylabel("prefix-matching score", color="C3")
    right.set_ylim(0, 1)
    handles = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    left.legend(handles=handles, fontsize=8, loc="center right")
    left.set_title("attn-only-2l over training (dots and squares: shipped checkpoints)", fontsize=9)
    return _save(fig, out, "training_dynamics.png")


PRINTABLE = "".join(map(chr, range(32, 127)))


def draw_all(out: Path, model: object, r: object, text: dict[str, Tensor]) -> None:
    """Every figure of the report, from the measurements `r` of `induction_circuit.main`."""
    c = r.circuit
    p, h = c.prev_head, c.induction_head
    generator = torch.Generator().manual_seed(1)
    segment = torch.randint(33, 127, (20,), generator=generator)  # visible characters
    short = torch.cat([torch.tensor([256]), segment, segment])[None]
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
        period=20,
    )
    head_scores(
        out,
        [
            (
                f"previous-token score (uniform {c.prev_scores.baseline:.3f})",
                c.prev_scores.scores,
                1.0,
            ),
            (f"induction score (uniform {c.induction.baseline:.3f})", c.induction.scores, 1.0),
            (f"OV copying score (random 0 ± {c.copying.baseline_std:.2f})", c.copying.scores, 1.0),
        ],
        {"prev": (0, p), "induction": (1, h)},
    )
    composition(
        out,
        [
            (
                f"{kind}-composition L0 -> L1 (random {s.baseline:.3f} ± {s.baseline_std:.3f})",
                s.scores[0, :, 1, :],
            )
            for kind, s in sorted(c.composition.items(), key=lambda x: x[0] != "K")
        ],
        (p, h),
    )
    logit_attribution(out, c.attribution, c.attribution_first)
    icl_curves(
        out,
        {
            "attn-only-1l": r.one_layer.per_position,
            "attn-only-2l": c.clean.per_position,
            f"attn-only-2l, L1H{h} ablated (patterns kept)": c.ablated[h].per_position,
        },
        text,
        {"ln 256 (uniform)": 5.545, "order-blind": c.clean.order_blind},
    )
    circuits(
        out,
        c.matrices,
        {
            "positional": f"L0H{p}: W_pos QK W_pos^T (query pos x key pos)",
            "composed": f"L1H{h} via L0H{p}: W_E QK (W_E OV_L0H{p})^T\n"
            "query byte x byte before key",
            "direct": f"L1H{h} direct: W_E QK W_E^T\nquery byte x key byte",
            "ov": f"L1H{h}: W_E OV W_U\nattended byte x output logit",
        },
        PRINTABLE,
    )
    d = r.dynamics
    training_dynamics(out, d.history, d.steps, d.induction, d.repeat_icl)
