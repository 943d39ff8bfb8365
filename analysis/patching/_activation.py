"""Activation patching: every component of one kind, patched one at a time, batched."""

from analysis.patching._components import component_grid, component_masks
from analysis.patching._engine import Edit, base_run, sweep
from analysis.patching._inputs import (
    Metric,
    check_direction,
    check_metric_reads,
    declared_positions,
    paired_tokens,
    warn_if_tied,
)
from analysis.patching.result import PatchingResult
from hookedattn import HookedTransformer


def activation_patch(
    model: HookedTransformer,
    kind: str = "z",
    *,
    # [batch pos] token ids, loosely annotated so that a mismatch (a cache passed in
    # TransformerLens's order, a wrong dtype or shape) gets our own message.
    clean_tokens: object,
    corrupted_tokens: object,
    metric: Metric,
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
    `[batch pos d_vocab_out]` logits to one number per prompt, `[batch]`. The prompts are
    keyword-only, so that they cannot be swapped by position.

    `direction="denoising"` runs the corrupted prompts with one clean activation patched
    in; `"noising"` the reverse. The numbers are those of one forward pass per patch
    (TransformerLens's `patching` module); the passes stack variants along the batch axis,
    each recomputing only what its patch can change, in passes of at most about
    `memory_budget` bytes (default: a quarter of the device's free memory).

    `metric_positions` (e.g. `-1`, or `[4, -1]`) declares the positions whose logits the
    metric reads; then each pass computes only what those need: the metric gets logits
    exact there and NaN elsewhere, and a `ValueError` names any other position it reads.
    """
    clean_tokens, corrupted_tokens = paired_tokens(model, clean_tokens, corrupted_tokens)
    check_direction(direction)
    n_pos = clean_tokens.shape[1]
    grid = component_grid(model, kind, n_pos, by_pos)
    hooks = sorted({c.hook_name for c in grid.components})
    clean = base_run(model, clean_tokens, metric, hooks)
    corrupted = base_run(model, corrupted_tokens, metric, hooks)
    warn_if_tied(clean.metric, corrupted.metric)
    declared = None
    if metric_positions is not None:
        declared = declared_positions(metric_positions, n_pos)
        for run in (clean, corrupted):
            check_metric_reads(metric, run.logits, run.metric, declared, metric_positions)
    target, source = (corrupted, clean) if direction == "denoising" else (clean, corrupted)
    components = grid.components
    edits = [
        Edit(
            c.name,
            c.layer,
            component_masks(components, c.hook_name, source.cache[c.hook_name].shape[1:]),
            source.cache[c.hook_name],
        )
        for c in {c.hook_name: c for c in components}.values()
    ]
    labels = [c.label() for c in components]
    per_prompt = sweep(
        model, target, edits, len(components), metric, declared, memory_budget, labels
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
