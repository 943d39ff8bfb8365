"""Heatmaps of patching results: one call, one labelled PNG.

`heatmap(result, "out.png")` draws any `PatchingResult` (activation, path or attribution
patching) or `PatchingComparison` with its axes named and its ticks labelled. matplotlib
is imported only here, when a plot is drawn (`pip install hookedattn[report]`), and
drawn on its Agg canvas directly, so pyplot's global backend and figures are untouched.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from analysis._naming import head_label
from analysis.patching.result import PatchingComparison, PatchingResult

VALUES = ("normalised", "values", "effect")
# One colour convention for every figure of the project (these heatmaps and the report's):
# signed values diverge from white at 0, blue for positive and red for negative, on a scale
# symmetric about 0; values that cannot be negative (attention, scores in [0, 1]) go from
# white at 0 to blue.
SIGNED_CMAP = "RdBu"
UNSIGNED_CMAP = "Blues"
_ANNOTATE_UP_TO = 24  # cells per side below which each cell shows its number


def heatmap(
    result: PatchingResult | PatchingComparison,
    path: str | Path,
    *,
    value: str = "normalised",
    title: str | None = None,
    pos_labels: Sequence[str] | None = None,
) -> Path:
    """Write `result` as a labelled heatmap PNG to `path`; returns the path.

    `value`: which map of a `PatchingResult` to draw, `"normalised"` (0 = corrupted,
    1 = clean), `"values"` (the metric) or `"effect"` (the change the patch makes). A
    `PatchingComparison` draws the approximate, exact and error maps side by side.
    `[layer pos head]` results are drawn with one row per head of each layer.
    `pos_labels` replaces the position ticks, e.g. by the prompt's tokens.
    """
    figure = heatmap_figure(result, value=value, title=title, pos_labels=pos_labels)
    path = Path(path)
    figure.savefig(path, dpi=120, bbox_inches="tight")
    return path


def heatmap_figure(
    result: PatchingResult | PatchingComparison,
    *,
    value: str = "normalised",
    title: str | None = None,
    pos_labels: Sequence[str] | None = None,
) -> Any:
    """The `matplotlib.figure.Figure` that `heatmap` saves, for notebooks and further edits."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    if value not in VALUES:
        raise ValueError(f"value must be one of {', '.join(map(repr, VALUES))}, got {value!r}")
    if isinstance(result, PatchingComparison):
        base = result.exact
        panels = [
            (f"{result.approx.method}", result.approx.normalised),
            (f"{result.exact.method}", result.exact.normalised),
            ("approximate - exact", result.error),
        ]
        value = "normalised"
    elif isinstance(result, PatchingResult):
        base = result
        panels = [("", getattr(result, value))]
    else:
        raise TypeError(f"expected a PatchingResult or PatchingComparison, got {type(result)}")
    labels = _with_pos_labels(base, pos_labels)
    rows, cols, row_name, col_name = _as_grid(base.axes, labels)
    n_rows, n_cols = len(rows), len(cols)
    width = min(4 + 0.45 * n_cols, 16)
    height = min(2 + 0.35 * n_rows, 14)
    figure = Figure(figsize=(width * len(panels), height), layout="constrained")
    FigureCanvasAgg(figure)
    for i, (panel_title, data) in enumerate(panels):
        ax = figure.add_subplot(1, len(panels), i + 1)
        grid = _as_matrix(base.axes, data.detach().to("cpu", torch.float64))
        _draw(figure, ax, grid, rows, cols, row_name, col_name, value)
        ax.set_title(panel_title, fontsize=10)
    if title is None:
        title = _title(base, value)
        if isinstance(result, PatchingComparison):
            title = f"{result.approx.method} vs {title}"
    figure.suptitle(title, fontsize=11)
    return figure


def _with_pos_labels(
    result: PatchingResult, pos_labels: Sequence[str] | None
) -> tuple[tuple[str, ...], ...]:
    if pos_labels is None:
        return result.labels
    if "pos" not in result.axes:
        raise ValueError(f"pos_labels given, but this result has no pos axis: {result.axes}")
    n_pos = result.shape[result.axes.index("pos")]
    if len(pos_labels) != n_pos:
        raise ValueError(f"pos_labels has {len(pos_labels)} labels for {n_pos} positions")
    return tuple(
        tuple(map(str, pos_labels)) if axis == "pos" else ticks
        for axis, ticks in zip(result.axes, result.labels, strict=True)
    )


def _as_grid(
    axes: tuple[str, ...], labels: tuple[tuple[str, ...], ...]
) -> tuple[list[str], list[str], str, str]:
    """Row and column tick labels, and the axis names, of the 2-D picture of `axes`."""
    if len(axes) == 1:
        return [""], list(labels[0]), "", axes[0]
    if len(axes) == 2:
        return list(labels[0]), list(labels[1]), axes[0], axes[1]
    if len(axes) == 3:  # [a b c]: one row per (a, c), b across
        if (axes[0], axes[2]) == ("layer", "head"):  # the label every result spells
            rows = [head_label(int(a), int(c)) for a in labels[0] for c in labels[2]]
        else:
            rows = [
                f"{axes[0][0].upper()}{a} {axes[2][0].upper()}{c}"
                for a in labels[0]
                for c in labels[2]
            ]
        return rows, list(labels[1]), f"{axes[0]}, {axes[2]}", axes[1]
    raise ValueError(f"cannot draw a result with {len(axes)} axes {axes} as a heatmap")


def _as_matrix(axes: tuple[str, ...], data: Tensor) -> Tensor:
    if len(axes) == 1:
        return data[None]
    if len(axes) == 3:
        return data.permute(0, 2, 1).reshape(-1, data.shape[1])
    return data


def _draw(figure, ax, grid: Tensor, rows, cols, row_name: str, col_name: str, value: str) -> None:
    finite = grid[grid.isfinite()]
    limit = float(finite.abs().max()) if finite.numel() else 1.0
    limit = limit or 1.0
    image = ax.imshow(grid.numpy(), cmap=SIGNED_CMAP, vmin=-limit, vmax=limit, aspect="auto")
    ax.set_xticks(range(len(cols)), cols, rotation=90 if max(map(len, cols)) > 2 else 0)
    ax.set_yticks(range(len(rows)), rows)
    ax.set_xlabel(col_name)
    ax.set_ylabel(row_name)
    figure.colorbar(image, ax=ax, label=value, shrink=0.8)
    if max(len(rows), len(cols)) <= _ANNOTATE_UP_TO:
        for r, row in enumerate(grid.tolist()):
            for c, x in enumerate(row):
                ink = "white" if abs(x) > 0.6 * limit else "black"  # readable on dark cells
                ax.text(c, r, f"{x:.2f}", ha="center", va="center", fontsize=7, color=ink)


def _title(result: PatchingResult, value: str) -> str:
    return (
        f"{result.method} ({result.direction}) of {result.kind}: {value}   "
        f"[clean {result.clean_baseline:.3g}, corrupted {result.corrupted_baseline:.3g}]"
    )
