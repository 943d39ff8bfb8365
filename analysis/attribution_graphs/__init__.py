"""Attribution graphs: a prediction explained through transcoder features, edge by edge.

    from analysis.attribution_graphs import attribution_graph, prune_graph, graph_json
    graph = attribution_graph(model, transcoders, prompt)    # every direct effect, exact
    pruned = prune_graph(graph, node_threshold=0.8)           # the nodes that matter most
    graph_json(graph, pruned)                                 # circuit-tracer / Neuronpedia
    intervene(model, transcoders, prompt, [FeatureIntervention(1, 7, 42, 0.0)])
    graph_qk_attribution(model, transcoders, graph, layer=1, head=6, key_pos=14)  # QK side
    graph_json(graph, pruned, qk=[...])                       # QK terms on the graph page
    pruned_attribution_graph(model, transcoders, prompt, memory_budget="1GiB")  # long prompts

Axes: `node` (features, error nodes, tokens, logits, in that order), `feature` (active
features), `logit` (target logits). The modules: `attribution_graph` (the graph and how it
is built), `_frozen` (the linearised model), `pruning`, `export`, `intervention`, and `qk`
(one attention score in terms of the graph's nodes), `streaming` (the pruned graph computed
in chunks under a memory budget, without the dense one). Formerly `analysis.graphs`, a name
that still imports. More in `docs/guide/transcoders.md`.
"""

from analysis.attribution_graphs.attribution_graph import AttributionGraph, attribution_graph
from analysis.attribution_graphs.export import graph_json, save_graph_json
from analysis.attribution_graphs.intervention import FeatureIntervention, intervene
from analysis.attribution_graphs.pruning import (
    PrunedGraph,
    influence,
    normalized_adjacency,
    prune_graph,
)
from analysis.attribution_graphs.qk import graph_qk_attribution
from analysis.attribution_graphs.streaming import PrunedAttributionGraph, pruned_attribution_graph

__all__ = [
    "AttributionGraph",
    "FeatureIntervention",
    "PrunedAttributionGraph",
    "PrunedGraph",
    "attribution_graph",
    "graph_json",
    "graph_qk_attribution",
    "influence",
    "intervene",
    "normalized_adjacency",
    "prune_graph",
    "pruned_attribution_graph",
    "save_graph_json",
]
