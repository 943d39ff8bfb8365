"""Heatmaps of patching results: labelled, written as PNG, pyplot untouched."""

import pytest
import torch

matplotlib = pytest.importorskip("matplotlib")

from analysis.patching import (  # noqa: E402
    Component,
    activation_patch,
    attribution_patch,
    compare_patching,
    path_patch,
)
from analysis.plots import heatmap, heatmap_figure  # noqa: E402
from hookedattn.testing import tiny_model  # noqa: E402

GEN = torch.Generator().manual_seed(0)
CLEAN, CORRUPTED = (torch.randint(0, 11, (2, 4), generator=GEN) for _ in range(2))
MODEL = tiny_model(d_model=8, n_heads=2, n_ctx=8, d_vocab=11, attn_only=True, dtype=torch.float32)


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 1] - logits[:, -1, 0]


PROMPTS = dict(clean_tokens=CLEAN, corrupted_tokens=CORRUPTED, metric=metric)


def tick_texts(ax, which: str) -> list[str]:
    ticks = ax.get_xticklabels() if which == "x" else ax.get_yticklabels()
    return [t.get_text() for t in ticks]


def test_layer_by_head_result_is_labelled():
    result = activation_patch(MODEL, "z", **PROMPTS)
    figure = heatmap_figure(result)
    ax = figure.axes[0]
    assert ax.get_xlabel() == "head" and ax.get_ylabel() == "layer"
    assert tick_texts(ax, "x") == ["0", "1"] and tick_texts(ax, "y") == ["0", "1"]
    assert "activation patching (denoising) of z: normalised" in figure._suptitle.get_text()
    cells = [t.get_text() for t in ax.texts]
    assert cells == [f"{x:.2f}" for x in result.normalised.flatten().tolist()]


def test_three_axes_become_one_row_per_head_of_each_layer():
    result = activation_patch(MODEL, "z", **PROMPTS, by_pos=True)
    figure = heatmap_figure(result, value="effect", pos_labels=["a", "b", "c", "d"])
    ax = figure.axes[0]
    assert tick_texts(ax, "y") == ["L0H0", "L0H1", "L1H0", "L1H1"]
    assert tick_texts(ax, "x") == ["a", "b", "c", "d"]
    assert ax.texts[1].get_text() == f"{float(result.effect[0, 1, 0]):.2f}"  # L0 H0 at pos b


def test_writes_png_files_for_every_kind_of_result(tmp_path):
    results = [
        activation_patch(MODEL, "resid_pre", **PROMPTS),
        activation_patch(MODEL, "attn_out", **PROMPTS, by_pos=False),
        path_patch(MODEL, Component("v", 1, head=0), **PROMPTS),
        attribution_patch(MODEL, "pattern", **PROMPTS)["pattern"],
    ]
    exact = activation_patch(MODEL, "pattern", **PROMPTS)
    results.append(compare_patching(results[-1], exact))
    for i, result in enumerate(results):
        path = heatmap(result, tmp_path / f"{i}.png")
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_comparison_draws_approximate_exact_and_error():
    approx = attribution_patch(MODEL, "z", **PROMPTS)["z"]
    exact = activation_patch(MODEL, "z", **PROMPTS)
    figure = heatmap_figure(compare_patching(approx, exact))
    titles = [ax.get_title() for ax in figure.axes if ax.get_title()]
    assert titles == ["attribution patching", "activation patching", "approximate - exact"]


def test_leaves_pyplot_alone():
    backend = matplotlib.get_backend()
    pyplot = pytest.importorskip("matplotlib.pyplot")
    figures = pyplot.get_fignums()
    heatmap_figure(activation_patch(MODEL, "z", **PROMPTS))
    assert matplotlib.get_backend() == backend and pyplot.get_fignums() == figures


def test_bad_input():
    result = activation_patch(MODEL, "z", **PROMPTS)
    with pytest.raises(ValueError, match="value must be one of"):
        heatmap_figure(result, value="normalized")
    with pytest.raises(ValueError, match="no pos axis"):
        heatmap_figure(result, pos_labels=["a", "b", "c", "d"])
    by_pos = activation_patch(MODEL, "resid_pre", **PROMPTS)
    with pytest.raises(ValueError, match="3 labels for 4 positions"):
        heatmap_figure(by_pos, pos_labels=["a", "b", "c"])
    with pytest.raises(TypeError, match="PatchingResult"):
        heatmap_figure(torch.zeros(2, 2))
