"""The circuit page's data: boxes in the forward's rows, every edge once, its scores."""

import json

import pytest
import torch
from helpers.families import TOKENS, family_model

from analysis import Circuit, edge_attribution, edge_patching, view
from hookedattn.testing import random_tiny_model
from hookedattn.viewer import CircuitEdge, CircuitNode, circuit_data

CORRUPTED = torch.randint(0, 23, TOKENS.shape, generator=torch.Generator().manual_seed(7))


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 3] - logits[:, -1, 5]


PROMPTS = dict(clean_tokens=TOKENS, corrupted_tokens=CORRUPTED, metric=metric)


def test_rows_follow_the_forward_and_edges_carry_both_scores():
    model = random_tiny_model(d_vocab=23)
    eap, exact = edge_attribution(model, **PROMPTS), edge_patching(model, **PROMPTS)
    circuit = Circuit.top(eap, 5)
    data = view.circuit(eap, circuit=circuit, exact=exact).data
    rows = {node["label"]: node["row"] for node in data["nodes"]}
    assert rows["embed"] == 0 and rows["L0H3"] == 1 and rows["mlp0"] == 2
    assert rows["L1H0"] == 3 and rows["mlp1"] == 4 and rows["logits"] == 5
    assert [e["label"] for e in data["edges"]] == list(eap.labels)
    edge = data["edges"][eap.graph.index("L0H1 -> L1H2.k")]
    labels = [node["label"] for node in data["nodes"]]
    assert (labels[edge["from"]], labels[edge["to"]], edge["port"]) == ("L0H1", "L1H2", "k")
    assert edge["score"] == pytest.approx(eap["L0H1 -> L1H2.k"])
    assert edge["exact"] == pytest.approx(exact["L0H1 -> L1H2.k"])
    assert sum(e["in_circuit"] for e in data["edges"]) == 5
    json.dumps(data, allow_nan=False)  # travels as JSON


def test_grouped_keys_and_values_get_boxes_of_their_own():
    model = family_model("llama")
    data = view.circuit(edge_attribution(model, **PROMPTS)).data
    labels = [node["label"] for node in data["nodes"]]
    assert "L1KV0" in labels and "L1KV1" in labels
    edge = next(e for e in data["edges"] if e["label"] == "L0H2 -> L1KV1.v")
    assert (labels[edge["to"]], edge["port"]) == ("L1KV1", "v")
    assert data["has_exact"] is False  # attribution alone: no exact effects to show


def test_a_circuit_is_drawn_by_the_scores_it_was_chosen_by():
    model = random_tiny_model(d_vocab=23)
    exact = edge_patching(model, **PROMPTS)
    data = view.circuit(Circuit.top(exact, 3)).data
    assert data["method"] == "edge patching" and data["has_exact"] is True
    with pytest.raises(ValueError, match="has no scores"):
        view.circuit(Circuit(exact.graph, frozenset({0})))
    other = edge_patching(random_tiny_model(d_vocab=23, attn_only=True), **PROMPTS)
    with pytest.raises(ValueError, match="another graph"):
        view.circuit(exact, exact=other)


def test_edges_must_join_nodes_of_the_page():
    nodes = [CircuitNode("embed", 0), CircuitNode("logits", 1)]
    with pytest.raises(ValueError, match="joins node 2"):
        circuit_data(nodes, [CircuitEdge("x", 0, 2, "", 1.0)], method="m", clean=0.0, corrupted=1.0)
    with pytest.raises(ValueError, match="has port 'z'"):
        circuit_data(
            nodes, [CircuitEdge("x", 0, 1, "z", 1.0)], method="m", clean=0.0, corrupted=1.0
        )
