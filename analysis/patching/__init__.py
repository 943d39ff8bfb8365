"""Causal interventions: activation, path and attribution patching.

Caching tells what a model computed; patching tells what mattered. Every function here
attaches its hooks for one forward pass at a time, inside `model.hooks(...)`, and leaves
the model and its inputs as it found them. The signatures (stable; the prompts are
keyword-only, so that clean and corrupted cannot be swapped by position, as
TransformerLens's `(model, corrupted_tokens, clean_cache, metric)` order would swap them):

    activation_patch(model, kind="z", *, clean_tokens, corrupted_tokens, metric,
                     by_pos=None, direction="denoising", memory_budget=None,
                     metric_positions=None) -> PatchingResult
    path_patch(model, receivers, senders="z", *, clean_tokens, corrupted_tokens, metric,
               direction="noising", freeze_mlps=False, memory_budget=None,
               metric_positions=None) -> PatchingResult
    attribution_patch(model, kinds=None, *, clean_tokens, corrupted_tokens, metric,
                      by_pos=None, direction="denoising") -> PatchingResults
    compare_patching(approx, exact) -> PatchingComparison

The modules: `_components` (what can be patched), `_inputs` (the caller's inputs checked,
and the two unpatched runs), `_reference` (the definition: one forward per patch), the
engine that batches it, `_engine` (running the variants: packed where their patches stay
at their positions, otherwise stacked on the batch axis) with `_plan` (which variants run
together, from a cost measured at run time) and `_readout` (what the metric reads), and
one module per method.
"""

from analysis.patching._activation import activation_patch
from analysis.patching._attribution import PatchingResults, attribution_patch
from analysis.patching._components import Component, available_kinds
from analysis.patching._path import path_patch
from analysis.patching.result import PatchingComparison, PatchingResult, compare_patching

__all__ = [
    "Component",
    "PatchingComparison",
    "PatchingResult",
    "PatchingResults",
    "activation_patch",
    "attribution_patch",
    "available_kinds",
    "compare_patching",
    "path_patch",
]
