"""Causal interventions: activation, path and attribution patching.

Caching tells what a model computed; patching tells what mattered. Every function here
attaches its hooks for one forward pass at a time, inside `model.hooks(...)`, and leaves
the model and its inputs as it found them.
"""

from analysis.patching.activation import activation_patch
from analysis.patching.attribution_patching import PatchingResults, attribution_patch
from analysis.patching.components import Component, available_kinds
from analysis.patching.path import path_patch
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
