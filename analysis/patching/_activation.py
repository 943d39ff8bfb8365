"""Activation patching: every component of one kind, patched one at a time, batched.

The definition is `_reference` (one forward per patch); `_sweep` runs the same patches
together. More in `docs/guide/patching.md`.
"""

from collections.abc import Sequence

from analysis.patching import _experts
from analysis.patching._components import (
    EXPERT_KINDS,
    Component,
    component_grid,
    kind_layers,
)
from analysis.patching._edits import Edit, component_edits
from analysis.patching._inputs import BaseRun, Metric, base_runs, check_direction, paired_tokens
from analysis.patching._sweep import sweep
from analysis.patching.result import PatchingResult
from hookedattn import HookedTransformer
from hookedattn.core.names import get_act_name


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
    `by_pos=True`); in a mixture of experts `"expert_out"` (each expert's write, `[layer
    expert]` or `[layer pos expert]`), `"router_logits"` and `"expert_indices"` (a token's
    routing, `[layer pos]`); see `available_kinds(model)` for all. `metric(logits)` maps
    `[batch pos d_vocab_out]` logits to one number per prompt, `[batch]`; it is called on
    many variants at once through `torch.func.vmap` where it can be (checked against a
    plain call; one that vmap cannot run is called once per variant), so it should not
    count on being called once per patch. The prompts are keyword-only, so that they
    cannot be swapped by position.

    `direction="denoising"` runs the corrupted prompts with one clean activation patched
    in; `"noising"` the reverse. The numbers are those of one forward pass per patch
    (TransformerLens's `patching` module); the passes stack variants along the batch axis,
    each recomputing only what its patch can change, in passes of at most about
    `memory_budget` bytes (default: a quarter of the device's free memory).

    `metric_positions` (e.g. `-1`, or `[4, -1]`) declares the positions whose logits the
    metric reads; then each pass computes only what those need: the metric gets logits
    exact there and NaN elsewhere, and a `ValueError` names any other position it reads.
    """
    check_direction(direction)
    n_pos = paired_tokens(model, clean_tokens, corrupted_tokens)[0].shape[1]
    grid = component_grid(model, kind, n_pos, by_pos)
    hooks = _source_hooks(model, kind)
    runs = base_runs(model, clean_tokens, corrupted_tokens, metric, hooks, metric_positions)
    denoising = direction == "denoising"
    target, source = (runs.corrupted, runs.clean) if denoising else (runs.clean, runs.corrupted)
    components = grid.components
    per_prompt = sweep(
        model, target, _edits(model, kind, components, source, target), len(components),
        metric, runs.declared, memory_budget, lambda i: components[i].label(),
    )  # fmt: skip
    per_prompt = per_prompt.reshape(*grid.shape, -1)
    return PatchingResult(
        "activation patching", direction, kind, grid.axes, grid.labels, per_prompt,
        runs.clean.metric, runs.corrupted.metric,
    )  # fmt: skip


def _source_hooks(model: HookedTransformer, kind: str) -> list[str]:
    """The hook points the patches of `kind` take their values from."""
    if kind in EXPERT_KINDS:
        _experts.check_patchable(model)
        return _experts.hook_names(model)
    return [get_act_name(kind, layer) for layer in kind_layers(model, kind)]


def _edits(
    model: HookedTransformer,
    kind: str,
    components: Sequence[Component],
    source: BaseRun,
    target: BaseRun,
) -> list[Edit]:
    """One edit per component: its region of the target run takes the source run's values."""
    if kind in EXPERT_KINDS:
        return _experts.edits(model, components, source.cache, target.cache)
    return component_edits(components, source.cache)
