"""The circuit view: a model's components as a graph, its edges weighted by a score.

    page = circuit(nodes, edges, title="EAP-IG on bytes-attn-only-2l")
    page.save("circuit.html")

Rows are the forward's order (the embedding first, each block's heads, then its MLP, the
logits last); an edge runs from its sender to its receiver, into the receiver's query,
key or value port for a head. Its width follows |score|, its colour the sign. Clicking
an edge shows its score and its exact patching effect (when given); a chooser shows the
circuit's edges or the top k by |score|. The data are plain: `CircuitNode`s and
`CircuitEdge`s (`analysis.view.circuit` makes them from edge scores and a circuit).
"""

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from hookedattn.viewer.page import Page

PORTS = ("q", "k", "v", "")


@dataclasses.dataclass(frozen=True)
class CircuitNode:
    """A box of the graph: `label` (`"L1H2"`, `"mlp0"`, `"embed"`, `"logits"`) in `row`
    (0 at the top); boxes of one row are drawn in the order given."""

    label: str
    row: int


@dataclasses.dataclass(frozen=True)
class CircuitEdge:
    """An edge from node `sender` to node `receiver` (indices into the nodes), into its
    `port` (`"q"`, `"k"`, `"v"`, or `""` for an MLP or the logits). `score` sets its
    width and colour; `exact` is its exact patching effect (None if not computed);
    `in_circuit` whether the circuit keeps it."""

    label: str
    sender: int
    receiver: int
    port: str
    score: float
    exact: float | None = None
    in_circuit: bool = False


def _number(value: float | None) -> float | None:
    # JSON has no NaN: a NaN travels as null and shows as "NaN".
    return None if value is None or not math.isfinite(value) else float(value)


def circuit_data(
    nodes: Sequence[CircuitNode],
    edges: Sequence[CircuitEdge],
    *,
    method: str,
    clean: float,
    corrupted: float,
    top: int = 30,
) -> dict[str, Any]:
    """The JSON of a circuit page (checked: every edge joins two of the nodes).

    `top` is how many edges of largest |score| the page shows first when no edge is in
    the circuit.
    """
    if not nodes:
        raise ValueError("a circuit page needs at least one node")
    for edge in edges:
        for end in (edge.sender, edge.receiver):
            if not 0 <= end < len(nodes):
                raise ValueError(
                    f"edge {edge.label!r} joins node {end}; nodes are 0..{len(nodes) - 1}"
                )
        if edge.port not in PORTS:
            raise ValueError(f"edge {edge.label!r} has port {edge.port!r}; ports: {PORTS}")
    return {
        "kind": "circuit",
        "method": method,
        "clean": _number(clean),
        "corrupted": _number(corrupted),
        "nodes": [{"label": n.label, "row": n.row} for n in nodes],
        "edges": [
            {
                "label": e.label,
                "from": e.sender,
                "to": e.receiver,
                "port": e.port,
                "score": _number(e.score),
                "exact": _number(e.exact),
                "in_circuit": e.in_circuit,
            }
            for e in edges
        ],
        "has_exact": any(e.exact is not None for e in edges),
        "top": max(1, min(top, len(edges))) if edges else 0,
    }


def circuit(
    nodes: Sequence[CircuitNode],
    edges: Sequence[CircuitEdge],
    *,
    method: str,
    clean: float,
    corrupted: float,
    top: int = 30,
    title: str | None = None,
) -> Page:
    """A circuit as an interactive graph page (module docstring); `clean` and `corrupted`
    are the metric's baselines, `method` names what the scores are."""
    data = circuit_data(nodes, edges, method=method, clean=clean, corrupted=corrupted, top=top)
    rows = 1 + max(n.row for n in nodes)
    height = min(1600, 260 + 70 * rows)
    return Page(
        title or f"circuit: {method}", data, height=height, parts=("circuit.js", "circuit.css")
    )
