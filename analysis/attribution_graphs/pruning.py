"""Pruning an attribution graph to the nodes and edges that carry most of the influence on
its target logits (circuit-tracer's and Ameisen et al. 2025's rule).

Influence is measured on the graph with each target's incoming edges made non-negative and
normalised to sum to one, `Â[t, s] = |A[t, s]| / Σ_s' |A[t, s']|`: a node's influence is
its share of the target logits' inputs, through every path, `w @ (Â + Â² + ...)` with `w`
the logits' probabilities. Nodes are kept in order of influence until they hold
`node_threshold` of the total (tokens and logits always stay); edges of the graph on those
nodes are scored by `Â[t, s] · (influence of t + w_t)` and kept likewise to
`edge_threshold`; then, until nothing changes, a feature or error node without an outgoing
edge, or a feature without an incoming one, is dropped with its edges.

Every path ends at a token or an error node, and each step of `Â` passes on all of what
it receives, so the sources' influence sums to that of the logits: `error_fraction`, the
error nodes' share of it, is how much of the explanation the transcoders leave to their
error terms (one minus Ameisen et al.'s "replacement score").

More in `docs/guide/transcoders.md`.
"""

import dataclasses

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from analysis.attribution_graphs.attribution_graph import AttributionGraph


@dataclasses.dataclass(frozen=True, repr=False)
class PrunedGraph:
    """Which nodes and edges of `graph` are kept, and what they explain (module docstring).

    `node_mask: [node]`; `edge_mask: [node node]` (targets by sources); `influence: [node]`
    each node's influence on the target logits; `cumulative_influence: [node]` the share of
    the total held by the nodes at least as influential (circuit-tracer's node score).
    `fraction_explained` is the kept non-logit nodes' share of all non-logit influence,
    `edge_fraction_explained` the kept edges' share of the edge scores, `error_fraction` as
    in the module docstring.
    """

    graph: AttributionGraph
    node_threshold: float
    edge_threshold: float
    node_mask: Bool[Tensor, " node"]
    edge_mask: Bool[Tensor, "node node"]
    influence: Float[Tensor, " node"]
    cumulative_influence: Float[Tensor, " node"]
    fraction_explained: float
    edge_fraction_explained: float
    error_fraction: float

    @property
    def n_nodes(self) -> int:
        """Nodes kept."""
        return int(self.node_mask.sum())

    @property
    def n_edges(self) -> int:
        """Edges kept."""
        return int(self.edge_mask.sum())

    def kept_features(self) -> list[int]:
        """The kept feature nodes, most influential first."""
        nodes = self.node_mask[: self.graph.n_features].nonzero().flatten()
        return nodes[self.influence[nodes].argsort(descending=True)].tolist()

    def __repr__(self) -> str:
        g = self.graph
        return (
            f"PrunedGraph({self.n_nodes} of {g.n_nodes} nodes ({len(self.kept_features())} "
            f"features), {self.n_edges:,} edges; {self.fraction_explained:.1%} of the "
            f"influence kept, {self.error_fraction:.1%} of it through error nodes)"
        )


def normalized_adjacency(A: Float[Tensor, "node node"]) -> Float[Tensor, "node node"]:
    """`|A|` with each row (a target's incoming edges) scaled to sum to one (or zero)."""
    absolute = A.abs()
    return absolute / absolute.sum(-1, keepdim=True).clamp(min=1e-30)


def influence(
    A_hat: Float[Tensor, "node node"], weights: Float[Tensor, " node"], max_steps: int
) -> Float[Tensor, " node"]:
    """`weights @ (Â + Â² + ...)`: each node's influence on the weighted targets, through
    paths of up to `max_steps` edges (a graph's longest path is shorter)."""
    current = weights @ A_hat
    total = current.clone()
    for _ in range(max_steps):
        current = current @ A_hat
        if not bool(current.any()):
            return total
        total = total + current
    raise AssertionError(f"paths longer than {max_steps} edges: the graph is not layered")


def _threshold(scores: Tensor, fraction: float) -> Tensor:
    """The least score among the top scores that together hold `fraction` of the total."""
    ordered = scores.flatten().sort(descending=True).values
    cumulative = ordered.cumsum(0) / ordered.sum().clamp(min=1e-30)
    goal = torch.tensor(fraction, dtype=cumulative.dtype, device=cumulative.device)
    index = int(torch.searchsorted(cumulative, goal))
    return ordered[min(index, len(ordered) - 1)]


def _check_thresholds(node_threshold: float, edge_threshold: float) -> None:
    """Each threshold is a number in [0, 1]."""
    for name, value in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        if not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
            raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")


def prune_graph(
    graph: AttributionGraph, node_threshold: float = 0.8, edge_threshold: float = 0.98
) -> PrunedGraph:
    """Keep the nodes holding `node_threshold` of the influence on the target logits, and
    of their edges those holding `edge_threshold` (module docstring)."""
    _check_thresholds(node_threshold, edge_threshold)
    A, n = graph.adjacency, graph.n_nodes
    n_f = graph.n_features
    first_token, first_logit = graph.token_node(0), graph.logit_node(0)
    weights = torch.zeros(n, dtype=A.dtype, device=A.device)
    weights[first_logit:] = graph.logit_probabilities.to(A)
    steps = graph.n_layers + 2
    A_hat = normalized_adjacency(A)
    node_influence = influence(A_hat, weights, steps)
    node_mask = node_influence >= _threshold(node_influence[:first_logit], node_threshold)
    node_mask[first_token:] = True
    kept = A * node_mask[:, None] * node_mask[None, :]
    kept_hat = normalized_adjacency(kept)
    kept_influence = influence(kept_hat, weights, steps) + weights
    edge_scores = kept_hat * kept_influence[:, None]
    edge_mask = (edge_scores >= _threshold(edge_scores, edge_threshold)) & (kept != 0)
    _drop_dangling(node_mask, edge_mask, n_f, first_token)
    sorted_scores, order = node_influence.sort(descending=True)
    cumulative = torch.empty_like(node_influence)
    cumulative[order] = sorted_scores.cumsum(0) / sorted_scores.sum().clamp(min=1e-30)
    non_logit = node_influence[:first_logit]
    errors = node_influence[n_f:first_token].sum()
    return PrunedGraph(
        graph, float(node_threshold), float(edge_threshold), node_mask, edge_mask,
        node_influence, cumulative,
        float(non_logit[node_mask[:first_logit]].sum() / non_logit.sum().clamp(min=1e-30)),
        float(edge_scores[edge_mask].sum() / edge_scores.sum().clamp(min=1e-30)),
        float(errors / node_influence[n_f:first_logit].sum().clamp(min=1e-30)),
    )  # fmt: skip


def _drop_dangling(node_mask: Tensor, edge_mask: Tensor, n_features: int, first_token: int) -> None:
    """Until nothing changes: drop feature and error nodes without an outgoing edge, and
    features without an incoming one, with their edges (in place)."""
    while True:
        before = node_mask.clone()
        edge_mask &= node_mask[:, None] & node_mask[None, :]
        node_mask[:first_token] &= edge_mask[:, :first_token].any(0)
        node_mask[:n_features] &= edge_mask[:n_features].any(1)
        if bool((node_mask == before).all()):
            edge_mask &= node_mask[:, None] & node_mask[None, :]
            return
