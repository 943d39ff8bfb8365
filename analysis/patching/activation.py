"""Activation patching: every component of one kind, patched one at a time, batched."""

from torch import Tensor

from analysis.patching.components import component_grid
from analysis.patching.declared import (
    check_metric_reads,
    declared_positions,
    sweep_declared,
)
from analysis.patching.engine import base_run, sweep
from analysis.patching.inputs import Metric, paired_tokens
from analysis.patching.result import PatchingResult
from hookedattn import HookedTransformer


def activation_patch(
    model: HookedTransformer,
    # [batch pos] token ids, loosely annotated so that a mismatch gets our own message.
    clean_tokens: Tensor,
    corrupted_tokens: Tensor,
    metric: Metric,
    kind: str = "z",
    *,
    by_pos: bool | None = None,
    direction: str = "denoising",  # or "noising"
    memory_budget: int | None = None,
    # An int or a sequence of ints, loosely annotated so that bad input gets our message.
    metric_positions: object = None,
) -> PatchingResult:
    """Patch each component of `kind` on its own and record `metric` for every prompt.

    `kind` is a short hook name: `"resid_pre"`, `"resid_mid"`, `"resid_post"`,
    `"attn_out"`, `"mlp_out"` (results `[layer pos]`); `"z"` (each head's output), `"q"`,
    `"k"`, `"v"`, `"pattern"` (results `[layer head]`, or `[layer pos head]` with
    `by_pos=True`); see `available_kinds(model)` for all. `metric(logits)` maps
    `[batch pos d_vocab_out]` logits to one number per prompt, `[batch]`.

    `direction="denoising"` runs the corrupted prompts with one clean activation patched
    in; `"noising"` the reverse. The variants are stacked along the batch axis, in passes
    of at most about `memory_budget` bytes (default `default_memory_budget(model)`), each
    starting at the patched layer and position, and give the numbers of the one-by-one
    loop (TransformerLens's `patching` module).

    `metric_positions` (e.g. `-1`, or `[4, -1]`) declares the positions whose logits the
    metric reads; then each pass computes only what those need (`analysis.patching.declared`):
    the metric gets logits exact there and NaN elsewhere, and a `ValueError` names any
    other position it reads. The numbers are those of the full computation.
    """
    clean_tokens, corrupted_tokens = paired_tokens(model, clean_tokens, corrupted_tokens)
    if direction not in ("denoising", "noising"):
        raise ValueError(f"direction must be 'denoising' or 'noising', got {direction!r}")
    grid = component_grid(model, kind, clean_tokens.shape[1], by_pos)
    hooks = sorted({c.hook_name for c in grid.components})
    clean = base_run(model, clean_tokens, metric, hooks)
    corrupted = base_run(model, corrupted_tokens, metric, hooks)
    target, source = (corrupted, clean) if direction == "denoising" else (clean, corrupted)
    if metric_positions is None:
        per_prompt = sweep(model, target, source.cache, grid.components, metric, memory_budget)
    else:
        declared = declared_positions(metric_positions, clean_tokens.shape[1])
        for run in (clean, corrupted):
            check_metric_reads(metric, run, declared, metric_positions)
        per_prompt = sweep_declared(
            model, target, source.cache, grid.components, metric, declared, memory_budget
        )
    return PatchingResult(
        method="activation patching",
        direction=direction,
        kind=kind,
        axes=grid.axes,
        labels=grid.labels,
        per_prompt=per_prompt.reshape(*grid.shape, -1),
        clean=clean.metric,
        corrupted=corrupted.metric,
    )
