"""The attribution-graph page: a graph in circuit-tracer's / Neuronpedia's JSON, drawn.

    >>> from analysis.attribution_graphs import attribution_graph, graph_json
    >>> from hookedattn.viewer import graph_page
    >>> page = graph_page(graph_json(graph), examples=feature_examples(store, tcs, features))
    >>> page.save("graph.html")

On the page: one column per prompt position, one row per layer (tokens at the bottom,
logits at the top), the kept nodes in their cells and the kept links between them (blue
positive, red negative, width by |weight|). Hovering a node shows what it is, its
activation and influence, and for a feature its top activations from a store
(`hookedattn.sae.feature_examples`); clicking keeps it and shows only its links. The page
reads the JSON as it is, so a graph written by circuit-tracer opens too.

Attention scores opened in the graph's terms (`graph_json(graph, pruned, qk=[...])` with
`analysis.attribution_graphs.graph_qk_attribution`) are drawn below the graph, one table a
score: its largest query-writer × key-writer terms, the sum of the others, and the score;
hovering a term marks its two writers' nodes on the graph, clicking keeps them marked. A
graph without `qk_attributions` has no such section.
"""

import dataclasses
import html
from typing import Any

from hookedattn.viewer.page import _PLACEHOLDER, Page, _asset, script_json


@dataclasses.dataclass(frozen=True, repr=False)
class GraphPage(Page):
    """A `Page` drawn by the graph script (`graph.js`) instead of the viewer's own."""

    def html(self) -> str:
        """The whole document: template, style, the graph script and the data."""
        script = _asset("graph.js")
        assert not any(s in script.lower() for s in ("</script", "<script", "<!--"))
        fields = {
            "title": html.escape(self.title),
            "style": _asset("viewer.css") + _asset("graph.css"),
            "data": script_json({"title": self.title, **self.data}),
            "script": script,
        }
        return _PLACEHOLDER.sub(lambda m: fields[m.group(1)], _asset("template.html"))


def graph_page(
    graph: dict[str, Any],
    examples: dict[str, list[dict[str, Any]]] | None = None,
    title: str | None = None,
) -> GraphPage:
    """The page of `graph` (circuit-tracer's graph JSON:
    `analysis.attribution_graphs.graph_json`), with `examples`
    (`hookedattn.sae.feature_examples`: top activations by `"layer_feature"`) shown when a
    feature is hovered."""
    if not isinstance(graph, dict) or not {"metadata", "nodes", "links"} <= set(graph):
        raise ValueError(
            "graph must be a graph JSON object with metadata, nodes and links "
            "(analysis.attribution_graphs.graph_json makes one)"
        )
    prompt = graph["metadata"].get("prompt", "")
    data = {"kind": "attribution_graph", "graph": graph, "examples": examples or {}}
    return GraphPage(title or f"attribution graph: {prompt!r}", data, height=900)
