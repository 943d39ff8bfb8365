"""The patching engine, shared by the analysis packages: the one door into `patching/`.

Every causal method of `analysis` is built on the same pieces: the caller's inputs checked
and the unpatched runs (`_inputs`), the batched sweep of patched variants (`_sweep`, with
`_plan`'s memory figures), the regions a component covers (`_components`), frozen attention
patterns (`_pattern_ablation`) and the gradient of a metric at hook points (`_gradients`).
Edge patching, circuits and ACDC (`analysis.discovery`), attribution graphs' interventions
(`analysis.attribution_graphs`), feature patching and ablations take them from here, never
from a `_` module of `analysis.patching`; the modules of this package import each other
directly. What each name does: its own docstring; how the engine runs: the module
docstrings of `_sweep` and `_plan`, and the patching guide (`docs/guide/patching.md`).

    inputs       Metric, as_tokens, paired_tokens, metric_values, warn_if_tied, base_runs
    sweeps       Edit, sweep
    memory       default_memory_budget, itemsize, row_floats
    components   check_component, component_masks
    patterns     frozen_pattern_hooks, norm_sites
    gradients    MetricGradients, metric_gradients
"""

from analysis.patching._components import check_component, component_masks
from analysis.patching._edits import Edit
from analysis.patching._gradients import MetricGradients, metric_gradients
from analysis.patching._inputs import (
    Metric,
    as_tokens,
    base_runs,
    metric_values,
    paired_tokens,
    warn_if_tied,
)
from analysis.patching._pattern_ablation import frozen_pattern_hooks, norm_sites
from analysis.patching._plan import default_memory_budget, itemsize, row_floats
from analysis.patching._sweep import sweep

__all__ = [
    "Edit",
    "Metric",
    "MetricGradients",
    "as_tokens",
    "base_runs",
    "check_component",
    "component_masks",
    "default_memory_budget",
    "frozen_pattern_hooks",
    "itemsize",
    "metric_gradients",
    "metric_values",
    "norm_sites",
    "paired_tokens",
    "row_floats",
    "sweep",
    "warn_if_tied",
]
