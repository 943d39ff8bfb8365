"""Interactive pages of analysis results, and the compact tables notebooks show of them.

    from analysis import view
    view.attention(model, cache, tokens)             # every head's pattern (hookedattn.viewer)
    view.logit_attribution(model, cache, dla)        # per-token bars, one per component
    view.decomposition(model, cache, decomp)         # the same for a residual decomposition
    view.patching(result)                            # a PatchingResult as a heatmap
    view.circuit(scores, circuit=c, exact=exact)     # edges of a model as a graph

Each returns a `hookedattn.viewer.Page`: `page.save("x.html")` writes one self-contained
file, and a notebook displays it. The `*_table` functions are the `_repr_html_` of the
results (a cache's lives in `hookedattn`).

More in `docs/guide/viewer.md`.
"""

import itertools
import math
from typing import Any

from jaxtyping import Float
from torch import Tensor

from analysis._naming import head_label
from analysis._resid_stack import ResidStack
from analysis.direct_logit_attribution import LogitAttribution
from analysis.discovery import Circuit, EdgeScores, Graph
from analysis.head_detectors import HeadScores
from analysis.patching.result import PatchingResult
from hookedattn.core.cache import ActivationCache
from hookedattn.core.model import HookedTransformer
from hookedattn.viewer import CircuitEdge, CircuitNode, Page, attention, token_strings
from hookedattn.viewer import circuit as circuit_page

__all__ = [
    "attention",
    "circuit",
    "decomposition",
    "head_scores_table",
    "logit_attribution",
    "patching",
    "patching_table",
    "resid_stack_table",
]


def _bars_page(
    title: str,
    what: str,
    labels: tuple[str, ...],
    values: Float[Tensor, "component pos"],
    tokens: list[str],
    pos: int,
) -> Page:
    n = values.shape[1]
    if not -n <= pos < n:
        raise ValueError(f"pos must be in -{n}..{n - 1}, got {pos}")
    data = {
        "kind": "bars",
        "what": what,
        "labels": list(labels),
        "tokens": tokens,
        # [pos component]: one list of bars per token, as the page shows them.
        "values": values.detach().double().cpu().T.tolist(),
        "start_pos": pos % n,
    }
    return Page(title, data, height=min(1600, 260 + 22 * len(labels)))


def logit_attribution(
    model: HookedTransformer,
    cache: ActivationCache,
    dla: LogitAttribution,
    tokens: Any = None,
    *,
    batch: int = 0,
    pos: int = -1,
    title: str | None = None,
) -> Page:
    """Each component's direct contribution to the logit, as sortable bars per token.

    Click a token to see the bars at its position (the last one first); `tokens` as in
    `attention` (strings, ids, or read off the cache). The bars of a position add up to
    the model's logit (or logit difference) there.
    """
    values = dla.contributions[:, batch]
    strings = token_strings(model, cache, tokens, batch, values.shape[1])
    what = f"direct attribution to the {dla.metric}"
    return _bars_page(title or what, what, dla.labels, values, strings, pos)


def decomposition(
    model: HookedTransformer,
    cache: ActivationCache,
    decomp: ResidStack,
    tokens: Any = None,
    *,
    direction: Float[Tensor, " d_model"] | None = None,
    batch: int = 0,
    pos: int = -1,
    title: str | None = None,
) -> Page:
    """A residual decomposition's components as sortable bars per token.

    The bars are each component's norm, or with `direction` its projection onto it
    (`component @ direction`, which adds up over components to the stream's projection).
    """
    components = decomp.components[:, batch]
    if direction is None:
        values, what = components.norm(dim=-1), "norm"
    else:
        if direction.shape[-1] != components.shape[-1]:
            raise ValueError(
                f"direction has {direction.shape[-1]} entries, the stream {components.shape[-1]}"
            )
        values = components @ direction.to(components.device, components.dtype)
        what = "projection onto the direction"
    strings = token_strings(model, cache, tokens, batch, values.shape[1])
    what = f"{what} of each component of {decomp.hook_name}"
    return _bars_page(
        title or f"{type(decomp).__name__}: {what}", what, decomp.labels, values, strings, pos
    )


def _flat(values: Float[Tensor, "..."]) -> list[float | None]:
    # JSON has no NaN: a tied baseline's NaN travels as null and shows as "NaN".
    return [None if math.isnan(v) else v for v in values.detach().double().flatten().tolist()]


def patching(result: PatchingResult, title: str | None = None) -> Page:
    """A patching result as a heatmap (first two axes; a chooser for any further axis),
    normalised scores, patched metrics or effects on hover, the baselines beside it."""
    data = {
        "kind": "patching",
        "method": result.method,
        "direction": result.direction,
        "patch_kind": result.kind,
        "axes": list(result.axes),
        "labels": [list(map(str, ticks)) for ticks in result.labels],
        # Each cell's own label, as `result.label` writes it (`L1H3`), row-major.
        "cell_labels": [
            result.label(index) for index in itertools.product(*map(range, result.shape))
        ],
        "values": _flat(result.values),
        "normalised": _flat(result.normalised),
        "effect": _flat(result.effect),
        "clean": result.clean_baseline,
        "corrupted": result.corrupted_baseline,
        "n_prompts": int(result.clean.shape[0]),
    }
    rows = len(result.labels[0]) if len(result.axes) > 1 else 1
    default = f"{result.method} ({result.direction}) of {result.kind}"
    return Page(title or default, data, height=min(1400, 320 + 14 * rows))


def _graph_nodes(graph: Graph) -> tuple[list[CircuitNode], dict[str, int], dict[str, int]]:
    """The boxes in the forward's rows, and the box of each sender and each receiver."""
    nodes: list[CircuitNode] = []
    row = 0

    def add(label: str) -> int:
        nodes.append(CircuitNode(label, row))
        return len(nodes) - 1

    of_sender = {"embed": add("embed")}
    of_receiver: dict[str, int] = {}
    grouped = graph.n_kv_heads != graph.n_heads
    for layer in range(graph.n_layers):
        row += 1
        heads = [s for s in graph.senders if s.kind == "head" and s.layer == layer]
        for sender in heads:
            of_sender[sender.label] = add(sender.label)
        for sender in graph.senders:  # a hybrid's mixer: one box, its sender and receiver
            if sender.kind == "mixer" and sender.layer == layer:
                of_sender[sender.label] = of_receiver[sender.label] = add(sender.label)
        for g in range(graph.n_kv_heads) if grouped and heads else ():
            box = add(f"L{layer}KV{g}")
            of_receiver[f"L{layer}KV{g}.k"] = of_receiver[f"L{layer}KV{g}.v"] = box
        mlps = [s for s in graph.senders if s.kind == "mlp" and s.layer == layer]
        if mlps:
            row += 1
            of_sender[mlps[0].label] = of_receiver[mlps[0].label] = add(mlps[0].label)
    row += 1
    of_receiver["logits"] = add("logits")
    for receiver in graph.receivers:
        if receiver.label not in of_receiver:  # a head's own q, k or v
            of_receiver[receiver.label] = of_sender[head_label(receiver.layer, receiver.head)]
    return nodes, of_sender, of_receiver


def circuit(
    scores: EdgeScores | Circuit,
    *,
    circuit: Circuit | None = None,
    exact: EdgeScores | None = None,
    top: int = 30,
    title: str | None = None,
) -> Page:
    """A model's edges as a graph page: rows in the forward's order, each edge's width
    and colour from its score, clicking an edge shows its exact patching effect.

    `scores` are the edge scores drawn, or a `Circuit` (drawn by the scores it was chosen
    by); `circuit` marks its edges (shown first); `exact` gives the exact patching
    effects shown on click (`edge_patching`; the scores themselves when they are
    exact). Without a circuit the page opens on the `top` edges of largest |score|.
    """
    if isinstance(scores, Circuit):
        circuit = scores if circuit is None else circuit
        if scores.scores is None:
            raise ValueError("this circuit has no scores to draw: pass the EdgeScores too")
        scores = scores.scores
    graph = scores.graph
    for other in (circuit, exact):
        if other is not None and other.graph != graph:
            raise ValueError(f"{other!r} is of another graph than these scores ({graph!r})")
    if exact is None and scores.method == "edge patching":
        exact = scores
    nodes, of_sender, of_receiver = _graph_nodes(graph)
    kept = set() if circuit is None else circuit.edges
    edges = []
    for i, edge in enumerate(graph.edges):
        receiver = graph.receivers[edge.receiver]
        port = receiver.kind if receiver.kind in ("q", "k", "v") else ""
        sender = of_sender[graph.senders[edge.sender].label]
        effect = None if exact is None else float(exact.scores[i])
        score = float(scores.scores[i])
        edges.append(
            CircuitEdge(
                edge.label, sender, of_receiver[receiver.label], port, score, effect, i in kept
            )
        )
    method = (
        scores.method if scores.ig_steps is None else f"{scores.method}, {scores.ig_steps} steps"
    )
    default = f"{graph.model_name}: {method}" + ("" if circuit is None else f", {circuit!r}")
    return circuit_page(
        nodes,
        edges,
        method=method,
        clean=scores.clean_baseline,
        corrupted=scores.corrupted_baseline,
        top=top,
        title=title or default,
    )


# --------------------------------------------------------------- notebook tables
def resid_stack_table(stack: ResidStack, batch: int = 0, pos: int = -1) -> str:
    """The `_repr_html_` of a decomposition: each component's norm at one position."""
    return stack._repr_html_(batch, pos)


def head_scores_table(scores: HeadScores) -> str:
    """The `_repr_html_` of head scores: a `[layer head]` grid, the baseline above it."""
    return scores._repr_html_()


def patching_table(result: PatchingResult) -> str:
    """The `_repr_html_` of a patching result: its normalised scores as a grid (two axes
    that fit), or its largest effects, under the baselines."""
    return result._repr_html_()
