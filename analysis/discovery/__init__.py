"""Circuit discovery: the model's computational graph as edges, scored and pruned.

The residual stream is an exact sum of what each part wrote (`analysis.decomposition`),
so every reader of it (a head's query, key or value input, an MLP's input, the logits)
reads a sum of its writers' terms, and each (writer, reader) pair is an edge: a
well-defined term that can be patched alone.

    graph = Graph.from_model(model)          # senders, receivers, edges "L0H5 -> L1H2.k"
    exact = edge_patching(model, clean_tokens=clean, corrupted_tokens=corrupted,
                          metric=metric)     # the ground truth: one patched forward per edge
    eap = edge_attribution(model, ..., method="eap")              # 2 forwards, 1 backward
    ig = edge_attribution(model, ..., method="eap-ig", ig_steps=5)
    compare_edge_scores(eap, exact)          # Spearman, top-k overlap
    circuit = acdc(model, ..., threshold=0.05)                    # pruning, exact each step
    faithfulness(model, circuit, ...)        # the gap it recovers alone
    faithfulness_curve(model, eap, ...)      # top-k circuits against random ones

Every score is the metric's change when one edge carries the corrupted run's value of its
sender and everything else is clean; prompts are keyword-only, as in `analysis.patching`.
The modules: `computational_graph` (the edges), `_terms` (each sender's term, and the
copy of the model with a hook point at every receiver), `exact` (edge patching on the
patching engine, `analysis.patching.engine`), `edge_attribution` (EAP, EAP-IG), `scores`
(the result type and the comparison), `_circuit_run` (forwards with edges ablated),
`circuit` (circuits, faithfulness), `acdc`. More in `docs/guide/discovery.md`.
"""

from analysis.discovery._terms import receiver_terms
from analysis.discovery.acdc import acdc
from analysis.discovery.circuit import (
    Circuit,
    Faithfulness,
    FaithfulnessCurve,
    faithfulness,
    faithfulness_curve,
)
from analysis.discovery.computational_graph import Edge, Graph, Receiver, Sender
from analysis.discovery.edge_attribution import edge_attribution
from analysis.discovery.exact import edge_patching
from analysis.discovery.scores import EdgeAgreement, EdgeScores, compare_edge_scores

__all__ = [
    "Circuit",
    "Edge",
    "EdgeAgreement",
    "EdgeScores",
    "Faithfulness",
    "FaithfulnessCurve",
    "Graph",
    "Receiver",
    "Sender",
    "acdc",
    "compare_edge_scores",
    "edge_attribution",
    "edge_patching",
    "faithfulness",
    "faithfulness_curve",
    "receiver_terms",
]
