"""ACDC (Conmy et al. 2023, "Towards Automated Circuit Discovery"): threshold pruning by
exact patching, from the logits backwards.

Start from the full graph. Visit the receivers from the last to the first in the
forward's order (the logits, the last MLP, the last block's heads, ..., block 0's heads);
at each, ablate each of its remaining edges alone from the current circuit and measure
the metric exactly (a circuit forward: `analysis.discovery._circuit_run`); remove every
edge whose removal moves the mean metric by less than `threshold`; go on with the smaller
circuit. A receiver whose node has no edge left out of it (a head none of whose writes is
read any more) loses its edges without a forward: nothing it reads can matter.

One difference from Conmy et al.'s order: their ACDC tries a receiver's edges one after
another, each against the circuit the previous ones left; here a receiver's edges are all
tried in one batched forward against the same circuit (the circuit itself is one more
variant of it) and removed together. Removals that each cost less than the threshold can
cost more together; the returned circuit's own metric (`Faithfulness`) says what they did.
The threshold is in the metric's units (Conmy et al. use a KL divergence's).

More in `docs/guide/discovery.md`.
"""

import torch
from jaxtyping import Bool
from torch import Tensor

from analysis.discovery._circuit_run import circuit_metrics, prepare
from analysis.discovery.circuit import Circuit
from analysis.discovery.computational_graph import Graph
from analysis.discovery.scores import EdgeScores
from analysis.patching.engine import Metric
from hookedattn.core.model import HookedTransformer


def acdc(
    model: HookedTransformer,
    *,
    # [batch pos] token ids, loosely annotated so that bad input gets our own message.
    clean_tokens: object,
    corrupted_tokens: object,
    metric: Metric,
    threshold: float,
    ablation: str = "patch",
    memory_budget: int | None = None,
) -> Circuit:
    """The circuit ACDC keeps at `threshold` (module docstring).

    Its `scores` (method `"acdc"`) hold, per edge and prompt, the metric's change when the
    edge was tried (removed from the circuit of its step); 0 for the edges of a node that
    had no edge out left. `ablation` as in `faithfulness`: `"patch"` or `"mean"`.
    """
    # `not x >= 0` rather than `x < 0`: NaN compares false with everything.
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not threshold >= 0:
        raise ValueError(f"threshold must be a number >= 0 (metric units), got {threshold!r}")
    runs = prepare(model, clean_tokens, corrupted_tokens, metric, ablation)
    _check_finite(torch.stack([runs.clean, runs.corrupted]), "on the clean and corrupted prompts")
    graph = runs.graph
    kept = torch.ones(len(graph), dtype=torch.bool)
    effects = runs.clean.new_zeros(len(graph), runs.clean.shape[0])
    for r in reversed(range(len(graph.receivers))):
        into = [i for i, e in enumerate(graph.edges) if e.receiver == r and kept[i]]
        if not into:
            continue
        out = _edges_out(graph, r)
        if out is not None and not bool(kept[out].any()):  # nothing it reads can matter
            kept[into] = False
            continue
        tries = (~kept).repeat(len(into) + 1, 1)  # the circuit itself, then without each edge
        for j, i in enumerate(into):
            tries[j + 1, i] = True
        values = circuit_metrics(runs, tries, memory_budget)
        _check_finite(values, f"with the edges into {graph.receivers[r].label} ablated")
        change = values[1:] - values[0]
        effects[into] = change
        removed = [
            i for i, c in zip(into, change.mean(-1).tolist(), strict=True) if abs(c) < threshold
        ]
        kept[removed] = False
    scores = EdgeScores(graph, "acdc", effects, runs.clean, runs.corrupted)
    return Circuit(graph, frozenset(torch.nonzero(kept)[:, 0].tolist()), scores)


def _check_finite(values: Tensor, where: str) -> None:
    """Refuse metric values that are not finite: `abs(nan) < threshold` is False, so
    nothing would be pruned and the full graph would come back as a believable circuit."""
    if not bool(values.isfinite().all()):
        raise ValueError(
            f"the metric is not finite (NaN or inf) {where}: ACDC cannot compare an edge's "
            f"effect with the threshold; check the metric, and the model's weights (a NaN "
            f"weight makes every logit NaN)"
        )


def _edges_out(graph: Graph, receiver: int) -> Bool[Tensor, " edge"] | None:
    """The edges out of the node that receiver `receiver` belongs to (a key/value head's:
    those of every query head of its group); None for the logits, which always count."""
    r = graph.receivers[receiver]
    if r.kind == "logits":
        return None
    if r.kind in ("mlp", "mixer"):  # one node, the same sublayer's write
        mine = lambda s: s.kind == r.kind and s.layer == r.layer
    else:
        group = graph.n_heads // graph.n_kv_heads if r.kind in ("k", "v") else 1
        heads = range(r.head * group, (r.head + 1) * group)
        mine = lambda s: s.kind == "head" and s.layer == r.layer and s.head in heads
    nodes = {i for i, s in enumerate(graph.senders) if mine(s)}
    return torch.tensor([e.sender in nodes for e in graph.edges])
