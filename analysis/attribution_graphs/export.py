"""An attribution graph as circuit-tracer's / Neuronpedia's graph JSON.

The document (`circuit_tracer.frontend.graph_models.Model`, schema version 1):

    {"metadata": {"slug", "scan", "transcoder_list", "prompt_tokens", "prompt",
                  "node_threshold", "schema_version": 1, ...},
     "qParams": {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "",
                 "sg_pos": ""},
     "nodes": [{"node_id", "feature", "layer", "ctx_idx", "feature_type", "token_prob",
                "is_target_logit", "run_idx", "reverse_ctx_idx", "jsNodeId", "clerp",
                "influence", "activation"}, ...],
     "links": [{"source", "target", "weight"}, ...]}

Node ids: a feature `"{layer}_{feature}_{pos}"` (`feature_type` "cross layer transcoder",
`feature` the Cantor pairing of layer and feature, `jsNodeId` `"{layer}_{feature}-0"`), an
error node `"{layer}_-1_{pos}"` ("mlp reconstruction error"), a token `"E_{token}_{pos}"`
(layer "E", "embedding"), a logit `"{n_layers + 1}_{token}_{pos}"` ("logit", the first
target marked `is_target_logit`). `influence` is the node's cumulative influence score
and a link's `weight` the direct effect, source on target, as circuit-tracer writes them.
Our measurements of the pruning and the graph's conventions (`demeaned_logits`,
`dropped_first_position`: whether it follows circuit-tracer's, `attribution_graph`) ride
along under `metadata.hookedattn` (readers that do not know it ignore it). `prompt` is the
prompt as text (token ids decoded), `scan` the transcoders' name (`graph.scan`). A graph
pruned while it was computed (`pruned_attribution_graph`) writes the same document
(`edges_in_full_graph` is then null: its dense graph was never held).

Attention scores opened by `graph_qk_attribution` ride along as an extra top-level key
(circuit-tracer's pages ignore it; ours draws it, `hookedattn.viewer.graph_page`):

    "qk_attributions": [{"layer", "head", "query_pos", "key_pos", "score", "capped_score",
                         "n_terms", "terms": [{"query_node", "key_node", "query_label",
                                               "key_label", "value"}, ...],
                         "rest", "rest_terms"}, ...]

`terms` are the `qk_terms` largest in magnitude, `rest` the sum of the other `rest_terms`,
so `Σ terms + rest = score` (before any soft cap; `capped_score` after it, else null).
A writer's `*_node` is the id of its node in `nodes`, or null where it is not drawn: a
head, a bias or a skip term (not nodes of the graph), or a node pruning dropped; its
`*_label` is `graph.label`'s name (`L0.F92@14`, `L0.error@3`, `tok 'a'@2`, `L0H5`).

`save_graph_json` writes what circuit-tracer's `create_graph_files` writes for its local
server (`circuit_tracer.frontend.local_server.serve(data_dir)`): the graph as
`{slug}.json`, which the page fetches by slug, and the folder's index
`graph-metadata.json`, `{"graphs": [metadata, ...]}`, one entry per slug.

More in `docs/guide/transcoders.md`.
"""

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

from jaxtyping import Float, Int
from torch import Tensor

from analysis.attribution_graphs.attribution_graph import AttributionGraph
from analysis.attribution_graphs.pruning import PrunedGraph, prune_graph
from analysis.attribution_graphs.streaming import PrunedAttributionGraph
from analysis.qk_attribution import QKAttribution

Graph = AttributionGraph | PrunedAttributionGraph


class _Kept(NamedTuple):
    """What pruning kept, in node numbers: the nodes, and each link as (target, source,
    weight); with the pruning's measures (`PrunedGraph`'s fields of the same names)."""

    nodes: list[int]
    links: list[tuple[int, int, float]]
    pruning: Any  # a PrunedGraph or a PrunedAttributionGraph: the thresholds and fractions
    edges_in_full_graph: int | None


def _cantor(x: int, y: int) -> int:
    return (x + y) * (x + y + 1) // 2 + y


def _node(graph: Graph, node: int, influence: float) -> dict[str, Any]:
    """One node's entry."""
    base = {"token_prob": 0.0, "is_target_logit": False, "run_idx": 0, "reverse_ctx_idx": 0,
            "clerp": "", "influence": influence, "activation": None}  # fmt: skip
    n_f, n_pos, n = graph.n_features, graph.n_pos, graph.n_layers
    if node < n_f:
        layer, pos, feature = graph.features[node].tolist()
        return {**base, "node_id": f"{layer}_{feature}_{pos}", "feature": _cantor(layer, feature),
                "layer": str(layer), "ctx_idx": pos, "feature_type": "cross layer transcoder",
                "jsNodeId": f"{layer}_{feature}-0",
                "activation": float(graph.activations[node])}  # fmt: skip
    if node < graph.token_node(0):
        layer, pos = divmod(node - n_f, n_pos)
        return {**base, "node_id": f"{layer}_-1_{pos}", "feature": -1, "layer": str(layer),
                "ctx_idx": pos, "feature_type": "mlp reconstruction error",
                "jsNodeId": f"{layer}_-1-{pos}"}  # fmt: skip
    if node < graph.logit_node(0):
        pos = node - graph.token_node(0)
        token = int(graph.tokens[pos])
        return {**base, "node_id": f"E_{token}_{pos}", "feature": pos, "layer": "E",
                "ctx_idx": pos, "feature_type": "embedding",
                "jsNodeId": f"E_{token}-{pos}"}  # fmt: skip
    i = node - graph.logit_node(0)
    token, prob = int(graph.logit_tokens[i]), float(graph.logit_probabilities[i])
    return {**base, "node_id": f"{n + 1}_{token}_{n_pos - 1}", "feature": token,
            "layer": str(n + 1), "ctx_idx": n_pos - 1, "feature_type": "logit",
            "token_prob": prob, "is_target_logit": i == 0,
            "jsNodeId": f"L_{token}-{n_pos - 1}", "influence": None,
            "clerp": f'Output "{graph.logit_strings[i]}" (p={prob:.3f})'}  # fmt: skip


def graph_json(
    graph: Graph,
    pruned: PrunedGraph | None = None,
    *,
    slug: str = "hookedattn-graph",
    scan: str = "",
    qk: Sequence[QKAttribution] = (),
    qk_terms: int = 10,
) -> dict[str, Any]:
    """The graph (its kept part, `pruned`, default `prune_graph(graph)`; or a graph pruned
    while computed, `pruned_attribution_graph`, as it is) as circuit-tracer's graph JSON
    (module docstring). `scan` names the transcoders (Neuronpedia's id for them); by
    default `graph.scan`. `qk`: scores of this graph's prompt from `graph_qk_attribution`,
    written under `qk_attributions` with their `qk_terms` largest terms each."""
    kept = _kept(graph, pruned)
    p = kept.pruning
    nodes = {i: _node(graph, i, float(p.cumulative_influence[i])) for i in kept.nodes}
    links = [
        {"source": nodes[s]["node_id"], "target": nodes[t]["node_id"], "weight": w}
        for t, s, w in kept.links
    ]
    metadata = {
        "slug": slug,
        "scan": scan or graph.scan,
        "transcoder_list": [],
        "prompt_tokens": list(graph.token_strings),
        "prompt": graph.prompt,
        "node_threshold": p.node_threshold,
        "schema_version": 1,
        "hookedattn": {
            "edge_threshold": p.edge_threshold,
            "fraction_explained": p.fraction_explained,
            "edge_fraction_explained": p.edge_fraction_explained,
            "error_fraction": p.error_fraction,
            "nodes_in_full_graph": graph.n_nodes,
            "edges_in_full_graph": kept.edges_in_full_graph,
            "demeaned_logits": graph.demeaned_logits,
            "dropped_first_position": graph.dropped_first_position,
        },
    }
    qparams = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
    document = {"metadata": metadata, "qParams": qparams, "nodes": list(nodes.values()),
                "links": links}  # fmt: skip
    if qk:
        ids = {graph.label(i): entry["node_id"] for i, entry in nodes.items()}
        document["qk_attributions"] = [_qk_entry(graph, a, ids, qk_terms) for a in qk]
    return document


def _kept(graph: Graph, pruned: PrunedGraph | None) -> _Kept:
    """The kept nodes and links of a dense graph's pruning, or of a graph pruned while
    computed (whose `adjacency` is `[row kept]`: row r is node `nodes[rows[r]]`, column c
    node `nodes[c]`)."""
    if isinstance(graph, PrunedAttributionGraph):
        if pruned is not None:
            raise ValueError(
                "a PrunedAttributionGraph is pruned already: give it without pruned (got a "
                f"{type(pruned).__name__})"
            )
        rows, columns = graph.edge_mask.nonzero(as_tuple=True)
        targets, sources = graph.nodes[graph.rows[rows]], graph.nodes[columns]
        weights = graph.adjacency[rows, columns]
        nodes = graph.kept_nodes().sort().values.tolist()
        return _Kept(nodes, _triples(targets, sources, weights), graph, None)
    pruned = prune_graph(graph) if pruned is None else pruned
    if pruned.graph is not graph:
        raise ValueError("pruned is the pruning of another graph")
    targets, sources = pruned.edge_mask.nonzero(as_tuple=True)
    weights = graph.adjacency[targets, sources]
    nodes = pruned.node_mask.nonzero().flatten().tolist()
    edges = int((graph.adjacency != 0).sum())
    return _Kept(nodes, _triples(targets, sources, weights), pruned, edges)


def _triples(
    targets: Int[Tensor, " link"], sources: Int[Tensor, " link"], weights: Float[Tensor, " link"]
) -> list[tuple[int, int, float]]:
    """Links as (target, source, weight), ordered by target, then source: the dense
    graph's order, whichever layout they were read from."""
    order = sources.argsort(stable=True)
    order = order[targets[order].argsort(stable=True)]
    return list(zip(targets[order].tolist(), sources[order].tolist(), weights[order].tolist(),
                    strict=True))  # fmt: skip


def _qk_entry(
    graph: Graph, attribution: QKAttribution, ids: dict[str, str], n_terms: int
) -> dict[str, Any]:
    """One score's entry in `qk_attributions` (module docstring): its `n_terms` largest
    terms with their writers' node ids (`ids`: label to id, the drawn nodes), and the rest."""
    _check_of_graph(graph, attribution)
    if isinstance(n_terms, bool) or not isinstance(n_terms, int) or n_terms < 0:
        raise ValueError(f"qk_terms must be an int >= 0, got {n_terms!r}")
    flat = attribution.terms.flatten()
    order = flat.abs().argsort(descending=True, stable=True)
    listed, others = order[:n_terms], order[n_terms:]
    width = len(attribution.key_labels)
    terms = []
    for i, value in zip(listed.tolist(), flat[listed].tolist(), strict=True):
        query, key = attribution.query_labels[i // width], attribution.key_labels[i % width]
        terms.append({"query_node": ids.get(query), "key_node": ids.get(key),
                      "query_label": query, "key_label": key, "value": value})  # fmt: skip
    return {
        "layer": attribution.layer,
        "head": attribution.head,
        "query_pos": attribution.query_pos,
        "key_pos": attribution.key_pos,
        "score": attribution.score,
        "capped_score": attribution.capped_score,
        "n_terms": len(flat),
        "terms": terms,
        "rest": float(flat[others].sum()),
        "rest_terms": len(others),
    }


def _check_of_graph(graph: Graph, attribution: QKAttribution) -> None:
    """Refuse a score that is not of this graph's prompt in the graph's nodes: its first
    writer on each side is the token node at its position (`graph_qk_attribution`)."""
    if not isinstance(attribution, QKAttribution):
        raise ValueError(
            f"qk takes QKAttributions (graph_qk_attribution), got {type(attribution).__name__}"
        )
    sides = (("query", attribution.query_pos), ("key", attribution.key_pos))
    for side, pos in sides:
        first = getattr(attribution, f"{side}_labels")[0]
        token = graph.label(graph.token_node(pos)) if 0 <= pos < graph.n_pos else None
        if attribution.batch != 0 or first != token:
            raise ValueError(
                f"{attribution!r} is not in this graph's nodes: its first {side} writer is "
                f"{first!r}, the graph's token at {pos} is {token!r}; make it with "
                f"graph_qk_attribution(model, transcoders, graph, ...)"
            )


def save_graph_json(
    graph: Graph,
    path: str | Path,
    pruned: PrunedGraph | None = None,
    *,
    slug: str | None = None,
    scan: str = "",
    qk: Sequence[QKAttribution] = (),
    qk_terms: int = 10,
) -> Path:
    """Write the graph JSON (`graph_json(graph, pruned, slug=, scan=, qk=, qk_terms=)`)
    as circuit-tracer's local server reads it (module docstring): into the folder `path` as
    `{slug}.json` (slug default `"hookedattn-graph"`), or to the file `path`, `name.json`,
    whose name is the slug; and add its metadata to `graph-metadata.json` beside it
    (replacing an entry of the same slug). Returns the graph's file."""
    path = Path(path)
    if path.suffix == ".json":
        if slug not in (None, path.stem):
            raise ValueError(
                f"circuit-tracer's server finds a graph by its slug, as {{slug}}.json: slug "
                f"{slug!r} cannot be saved as {path.name}; give the folder, or {slug}.json"
            )
        slug, folder = path.stem, path.parent
    else:
        slug, folder = slug or "hookedattn-graph", path
        path = folder / f"{slug}.json"
    folder.mkdir(parents=True, exist_ok=True)
    document = graph_json(graph, pruned, slug=slug, scan=scan, qk=qk, qk_terms=qk_terms)
    path.write_text(json.dumps(document, allow_nan=False) + "\n")
    _add_to_index(folder / "graph-metadata.json", document["metadata"])
    return path


def _add_to_index(index: Path, metadata: dict[str, Any]) -> None:
    """`graph-metadata.json`: circuit-tracer's fields of each graph's metadata, by slug."""
    graphs = []
    if index.is_file():
        try:
            graphs = json.loads(index.read_text())["graphs"]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(
                f"{index} is not circuit-tracer's graph index ({{'graphs': [...]}}): {e!r}; "
                f"move it away to start a new one"
            ) from None
    entry = {k: v for k, v in metadata.items() if k != "hookedattn"}
    graphs = [g for g in graphs if g.get("slug") != entry["slug"]] + [entry]
    index.write_text(json.dumps({"graphs": graphs}, indent=2, allow_nan=False) + "\n")
