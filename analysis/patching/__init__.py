"""Causal interventions: activation, path and attribution patching, feature patching and
ablations.

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

Beside them, `feature_activation_patch` and `feature_attribution_patch` (SAE features),
`ablate` and `ablation_hooks` (zero, mean, resample) and the pattern-preserving ablation.
The modules: `_components`, `_inputs`, `_reference` (the definition: one forward per
patch), `_sweep` with `_edits`, `_packed`, `_passes`, `_plan` and `_readout` (the engine
that batches it), `_gradients`,
one module per method, and `engine`, the door the other analysis packages use. More in
`docs/guide/patching.md`.
"""

from analysis.patching._ablations import ablate, ablation_hooks
from analysis.patching._activation import activation_patch
from analysis.patching._attribution_patching import PatchingResults, attribution_patch
from analysis.patching._components import Component, available_kinds
from analysis.patching._path import path_patch
from analysis.patching._pattern_ablation import (
    frozen_pattern_hooks,
    pattern_preserving_ablation,
    pattern_preserving_hooks,
)
from analysis.patching.feature_patching import feature_activation_patch, feature_attribution_patch
from analysis.patching.result import PatchingComparison, PatchingResult, compare_patching

__all__ = [
    "Component",
    "PatchingComparison",
    "PatchingResult",
    "PatchingResults",
    "ablate",
    "ablation_hooks",
    "activation_patch",
    "attribution_patch",
    "available_kinds",
    "compare_patching",
    "feature_activation_patch",
    "feature_attribution_patch",
    "frozen_pattern_hooks",
    "path_patch",
    "pattern_preserving_ablation",
    "pattern_preserving_hooks",
]
