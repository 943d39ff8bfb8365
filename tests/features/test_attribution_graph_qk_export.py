"""The QK side of an attribution graph in its JSON: each score's largest terms, named by the
document's node ids, and the rest, adding up to the score in float64; and the JSON of a
graph pruned while it was computed, which is the dense pruning's.

The models and transcoder sets are those of tests/features/test_attribution_graph.py.
"""

import json
import math

import pytest
from test_attribution_graph import TOKENS, build

from analysis import qk_attribution
from analysis.attribution_graphs import (
    attribution_graph,
    graph_json,
    graph_qk_attribution,
    prune_graph,
    pruned_attribution_graph,
    save_graph_json,
)

EXACT = 1e-10
SCORES = ((1, 0, 8, 3), (1, 2, 8, 8), (1, 3, 5, 0), (0, 1, 8, 6))  # layer, head, query, key
CASES = [
    ("LN", "skip topk"),
    ("RMS, rotary, grouped", "cross-layer topk"),
    ("no norms", "jumprelu"),
]


def _exported(model_kind, set_kind, n_terms=6):
    model, tcs = build(model_kind, set_kind)
    graph = attribution_graph(model, tcs, TOKENS, top_k=2)
    qk = [graph_qk_attribution(model, tcs, graph, layer, head, key, query)
          for layer, head, query, key in SCORES]  # fmt: skip
    doc = graph_json(graph, prune_graph(graph, 0.8), qk=qk, qk_terms=n_terms)
    return model, graph, qk, doc


@pytest.fixture(scope="module")
def standard():
    return _exported("LN", "skip topk")


@pytest.mark.parametrize(("model_kind", "set_kind"), CASES)
def test_the_listed_terms_and_the_rest_sum_to_the_attributions_score(model_kind, set_kind):
    _, _, qk, doc = _exported(model_kind, set_kind)
    for attribution, entry in zip(qk, doc["qk_attributions"], strict=True):
        listed = math.fsum(term["value"] for term in entry["terms"])
        assert entry["score"] == attribution.score
        assert abs(listed + entry["rest"] - attribution.sum()) < EXACT
        assert abs(listed + entry["rest"] - entry["score"]) < EXACT


@pytest.mark.parametrize(("model_kind", "set_kind"), CASES)
def test_the_listed_terms_and_the_rest_sum_to_the_models_own_score(model_kind, set_kind):
    model, _, _, doc = _exported(model_kind, set_kind)
    _, cache = model.run_with_cache(TOKENS[None])  # the model itself: no transcoders
    for entry in doc["qk_attributions"]:
        scores = cache["attn_scores", entry["layer"]]
        assert scores.dtype.is_floating_point and scores.dtype.itemsize == 8
        own = float(scores[0, entry["head"], entry["query_pos"], entry["key_pos"]])
        listed = math.fsum(term["value"] for term in entry["terms"])
        assert abs(listed + entry["rest"] - own) < EXACT


def test_the_listed_terms_are_the_largest_in_magnitude(standard):
    _, _, qk, doc = standard
    for attribution, entry in zip(qk, doc["qk_attributions"], strict=True):
        largest = attribution.top(6).rows
        assert [(t["query_label"], t["key_label"], t["value"]) for t in entry["terms"]] == [
            (q, k, v) for q, k, v in largest
        ]
        n = attribution.terms.numel()
        assert entry["n_terms"] == n and entry["rest_terms"] == n - 6


def test_the_terms_node_ids_are_nodes_of_the_document(standard):
    _, _, _, doc = standard
    ids = {node["node_id"] for node in doc["nodes"]}
    named = [
        term[f"{side}_node"]
        for entry in doc["qk_attributions"]
        for term in entry["terms"]
        for side in ("query", "key")
        if term[f"{side}_node"] is not None
    ]
    assert named and set(named) <= ids


def test_a_writer_drawn_on_the_graph_is_named_by_its_nodes_id(standard):
    _, graph, _, doc = standard
    kept = prune_graph(graph, 0.8).node_mask.nonzero().flatten().tolist()
    id_of = {graph.label(i): node["node_id"] for i, node in zip(kept, doc["nodes"], strict=True)}
    terms = [term for entry in doc["qk_attributions"] for term in entry["terms"]]
    for term in terms:
        for side in ("query", "key"):
            assert term[f"{side}_node"] == id_of.get(term[f"{side}_label"])
    assert any(term["query_node"] is None for term in terms)  # heads and biases: no node


def test_a_score_not_in_the_graphs_nodes_is_refused(standard):
    model, graph, _, _ = standard
    _, cache = model.run_with_cache(TOKENS[None])
    by_sublayers = qk_attribution(model, cache, 1, 0, 8, 3)  # writers L0_mlp, not nodes
    with pytest.raises(ValueError, match="not in this graph's nodes.*graph_qk_attribution"):
        graph_json(graph, qk=[by_sublayers])


def test_a_document_without_scores_has_no_qk_key(standard):
    _, graph, _, _ = standard
    assert set(graph_json(graph, prune_graph(graph, 0.8))) == {
        "metadata", "qParams", "nodes", "links"
    }  # fmt: skip


def test_the_saved_file_holds_the_scores(standard, tmp_path):
    _, graph, qk, doc = standard
    path = save_graph_json(graph, tmp_path, prune_graph(graph, 0.8), qk=qk, qk_terms=6)
    assert json.loads(path.read_text())["qk_attributions"] == doc["qk_attributions"]


def test_a_graph_pruned_while_computed_writes_the_dense_prunings_document():
    model, tcs = build("RMS, rotary, grouped", "cross-layer topk")
    dense = attribution_graph(model, tcs, TOKENS, top_k=3)
    streamed = pruned_attribution_graph(model, tcs, TOKENS, top_k=3, progress=False)
    expected = graph_json(dense, prune_graph(dense))
    got = graph_json(streamed)
    assert [n["node_id"] for n in got["nodes"]] == [n["node_id"] for n in expected["nodes"]]
    for a, b in zip(got["nodes"], expected["nodes"], strict=True):
        assert a["influence"] == pytest.approx(b["influence"], abs=EXACT)
    assert [(k["source"], k["target"]) for k in got["links"]] == [
        (k["source"], k["target"]) for k in expected["links"]
    ]
    for a, b in zip(got["links"], expected["links"], strict=True):
        assert abs(a["weight"] - b["weight"]) < EXACT
    assert got["metadata"]["hookedattn"]["edges_in_full_graph"] is None


def test_a_graph_pruned_while_computed_writes_the_same_scores():
    model, tcs = build("LN", "skip topk")
    streamed = pruned_attribution_graph(model, tcs, TOKENS, top_k=2, progress=False)
    dense = attribution_graph(model, tcs, TOKENS, top_k=2)
    by_graph = [
        graph_json(g, qk=[graph_qk_attribution(model, tcs, g, 1, 0, 3, 8)])["qk_attributions"]
        for g in (streamed, dense)
    ]
    got, expected = (entries[0] for entries in by_graph)
    assert [(t["query_node"], t["key_node"]) for t in got["terms"]] == [
        (t["query_node"], t["key_node"]) for t in expected["terms"]
    ]
    assert abs(got["score"] - expected["score"]) < EXACT
