"""Attribution graphs: a prediction explained through transcoder features, edge by edge.

    from analysis.graphs import attribution_graph, prune_graph, graph_json
    graph = attribution_graph(model, transcoders, prompt)    # every direct effect, exact
    pruned = prune_graph(graph, node_threshold=0.8)           # the nodes that matter most
    graph_json(graph, pruned)                                 # circuit-tracer / Neuronpedia
    intervene(model, transcoders, prompt, [FeatureIntervention(1, 7, 42, 0.0)])

Axes: `node` (features, error nodes, tokens, logits, in that order), `feature` (active
features), `logit` (target logits).
"""

from analysis.graphs.export import graph_json, save_graph_json
from analysis.graphs.graph import AttributionGraph, attribution_graph
from analysis.graphs.intervention import FeatureIntervention, intervene
from analysis.graphs.pruning import PrunedGraph, influence, normalized_adjacency, prune_graph

__all__ = [
    "AttributionGraph",
    "FeatureIntervention",
    "PrunedGraph",
    "attribution_graph",
    "graph_json",
    "influence",
    "intervene",
    "normalized_adjacency",
    "prune_graph",
    "save_graph_json",
]
