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
prompt as text (token ids decoded), `scan` the transcoders' name (`graph.scan`).

`save_graph_json` writes what circuit-tracer's `create_graph_files` writes for its local
server (`circuit_tracer.frontend.local_server.serve(data_dir)`): the graph as
`{slug}.json`, which the page fetches by slug, and the folder's index
`graph-metadata.json`, `{"graphs": [metadata, ...]}`, one entry per slug.

More in `docs/guide/transcoders.md`.
"""

import json
from pathlib import Path
from typing import Any

from analysis.attribution_graphs.attribution_graph import AttributionGraph
from analysis.attribution_graphs.pruning import PrunedGraph, prune_graph


def _cantor(x: int, y: int) -> int:
    return (x + y) * (x + y + 1) // 2 + y


def _node(graph: AttributionGraph, node: int, influence: float) -> dict[str, Any]:
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
    graph: AttributionGraph,
    pruned: PrunedGraph | None = None,
    *,
    slug: str = "hookedattn-graph",
    scan: str = "",
) -> dict[str, Any]:
    """The graph (its kept part, `pruned`, default `prune_graph(graph)`) as circuit-tracer's
    graph JSON (module docstring). `scan` names the transcoders (Neuronpedia's id for them);
    by default `graph.scan`."""
    pruned = prune_graph(graph) if pruned is None else pruned
    if pruned.graph is not graph:
        raise ValueError("pruned is the pruning of another graph")
    kept = pruned.node_mask.nonzero().flatten().tolist()
    nodes = {i: _node(graph, i, float(pruned.cumulative_influence[i])) for i in kept}
    targets, sources = pruned.edge_mask.nonzero(as_tuple=True)
    weights = graph.adjacency[targets, sources].tolist()
    links = [
        {"source": nodes[s]["node_id"], "target": nodes[t]["node_id"], "weight": w}
        for t, s, w in zip(targets.tolist(), sources.tolist(), weights, strict=True)
    ]
    metadata = {
        "slug": slug,
        "scan": scan or graph.scan,
        "transcoder_list": [],
        "prompt_tokens": list(graph.token_strings),
        "prompt": graph.prompt,
        "node_threshold": pruned.node_threshold,
        "schema_version": 1,
        "hookedattn": {
            "edge_threshold": pruned.edge_threshold,
            "fraction_explained": pruned.fraction_explained,
            "edge_fraction_explained": pruned.edge_fraction_explained,
            "error_fraction": pruned.error_fraction,
            "nodes_in_full_graph": graph.n_nodes,
            "edges_in_full_graph": int((graph.adjacency != 0).sum()),
            "demeaned_logits": graph.demeaned_logits,
            "dropped_first_position": graph.dropped_first_position,
        },
    }
    qparams = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
    return {"metadata": metadata, "qParams": qparams, "nodes": list(nodes.values()), "links": links}


def save_graph_json(
    graph: AttributionGraph,
    path: str | Path,
    pruned: PrunedGraph | None = None,
    *,
    slug: str | None = None,
    scan: str = "",
) -> Path:
    """Write the graph JSON (`graph_json(graph, pruned, slug=, scan=)`) as circuit-tracer's
    local server reads it (module docstring): into the folder `path` as `{slug}.json` (slug
    default `"hookedattn-graph"`), or to the file `path`, `name.json`, whose name is the
    slug; and add its metadata to `graph-metadata.json` beside it (replacing an entry of
    the same slug). Returns the graph's file."""
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
    document = graph_json(graph, pruned, slug=slug, scan=scan)
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
