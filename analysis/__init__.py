"""analysis: what a model's weights and cache mean.

Pure functions of `(model, cache)`: they never mutate their inputs, never attach hooks on
their own behalf (patching excepted, always scoped), and each returns one type. The rooms:
`direct_logit_attribution`, `decomposition`, `circuits` and the other measures, one module
each; `patching/` (causal interventions, and the engine the other packages share),
`discovery/` (circuits in the model's computational graph of edges) and
`attribution_graphs/` (transcoder features). The modules' former paths still import, with
a `DeprecationWarning` (`analysis._moved`). The design page (`docs/design.md`) has the map.
"""

from analysis import _moved, attribution_graphs, induction, view
from analysis._resid_stack import AccumulatedResid, Decomposition, DecompositionError, ResidStack
from analysis.attribution_graphs import (
    AttributionGraph,
    FeatureIntervention,
    PrunedGraph,
    attribution_graph,
    graph_json,
    graph_qk_attribution,
    intervene,
    prune_graph,
)
from analysis.circuits import full_ov_circuit, full_qk_circuit, ov_circuit, qk_circuit
from analysis.composition import CompositionScores, composition_scores
from analysis.copying import CopyingScores, copying_scores
from analysis.decomposition import accumulated_resid, decompose_resid
from analysis.direct_logit_attribution import LogitAttribution, direct_logit_attribution
from analysis.discovery import (
    Circuit,
    EdgeAgreement,
    EdgeScores,
    Faithfulness,
    FaithfulnessCurve,
    Graph,
    acdc,
    compare_edge_scores,
    edge_attribution,
    edge_patching,
    faithfulness,
    faithfulness_curve,
    receiver_terms,
)
from analysis.experts import (
    ExpertRows,
    ExpertUsage,
    expert_rows,
    expert_usage,
    expert_writes,
    shared_write,
    usage_of_choices,
)
from analysis.features import feature_decomposition, feature_logit_attribution
from analysis.head_detectors import (
    HeadScores,
    detect_head,
    duplicate_token_scores,
    induction_scores,
    prev_token_scores,
    repeated_random_tokens,
)
from analysis.head_results import (
    SourceContributions,
    head_results,
    head_source_contributions,
    head_values,
    head_writes,
    stacked_head_results,
)
from analysis.logit_lens import LogitLens, logit_lens
from analysis.normalization import (
    NormSite,
    apply_ln_to_stack,
    normalize,
    normalize_by,
    reading_norm,
    through_norm,
)
from analysis.patching import (
    Component,
    PatchingComparison,
    PatchingResult,
    PatchingResults,
    ablate,
    ablation_hooks,
    activation_patch,
    attribution_patch,
    available_kinds,
    compare_patching,
    feature_activation_patch,
    feature_attribution_patch,
    frozen_pattern_hooks,
    path_patch,
    pattern_preserving_ablation,
    pattern_preserving_hooks,
)
from analysis.plots import heatmap, heatmap_figure
from analysis.probes import Probe, ProbeData, ProbeReadout, ProbeReport, train_probe
from analysis.qk_attribution import QKAttribution, qk_attribution
from analysis.steering import SteeringSweep, SteeringVector, steering_sweep
from analysis.tables import Table
from hookedattn.core.factored_matrix import SVD, FactoredMatrix

__all__: list[str] = [
    # decomposition, attribution, head detectors
    "AccumulatedResid",
    "Decomposition",
    "DecompositionError",
    "HeadScores",
    "LogitAttribution",
    "LogitLens",
    "NormSite",
    "QKAttribution",
    "ResidStack",
    "SourceContributions",
    "Table",
    "accumulated_resid",
    "apply_ln_to_stack",
    "decompose_resid",
    "detect_head",
    "direct_logit_attribution",
    "duplicate_token_scores",
    "feature_activation_patch",
    "feature_attribution_patch",
    "feature_decomposition",
    "feature_logit_attribution",
    "frozen_pattern_hooks",
    "head_results",
    "head_source_contributions",
    "head_values",
    "head_writes",
    "induction_scores",
    "logit_lens",
    "normalize",
    "normalize_by",
    "pattern_preserving_ablation",
    "pattern_preserving_hooks",
    "prev_token_scores",
    "qk_attribution",
    "reading_norm",
    "repeated_random_tokens",
    "stacked_head_results",
    "through_norm",
]

# circuits, composition, copying
__all__ += [
    "SVD",
    "CompositionScores",
    "CopyingScores",
    "FactoredMatrix",
    "composition_scores",
    "copying_scores",
    "full_ov_circuit",
    "full_qk_circuit",
    "ov_circuit",
    "qk_circuit",
]

# circuit discovery: the graph of edges, edge scores, circuits
__all__ += [
    "Circuit",
    "EdgeAgreement",
    "EdgeScores",
    "Faithfulness",
    "FaithfulnessCurve",
    "Graph",
    "acdc",
    "compare_edge_scores",
    "edge_attribution",
    "edge_patching",
    "faithfulness",
    "faithfulness_curve",
    "receiver_terms",
]

# mixtures of experts, at expert granularity
__all__ += [
    "ExpertRows",
    "ExpertUsage",
    "expert_rows",
    "expert_usage",
    "expert_writes",
    "shared_write",
    "usage_of_choices",
]

# the namespaces of the induction report's measures and of the interactive views
__all__ += ["induction", "view"]

# attribution graphs through transcoder features (the whole package: analysis.attribution_graphs,
# also reached by its former name, analysis.graphs)
graphs = attribution_graphs
__all__ += [
    "AttributionGraph",
    "FeatureIntervention",
    "PrunedGraph",
    "attribution_graph",
    "attribution_graphs",
    "graph_json",
    "graph_qk_attribution",
    "graphs",
    "intervene",
    "prune_graph",
]

# patching, ablations, plots
__all__ += [
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
    "heatmap",
    "heatmap_figure",
    "path_patch",
]

# interpretability during generation: steering vectors, probes
__all__ += [
    "Probe",
    "ProbeData",
    "ProbeReadout",
    "ProbeReport",
    "SteeringSweep",
    "SteeringVector",
    "steering_sweep",
    "train_probe",
]

_moved.install()
