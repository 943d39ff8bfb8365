"""The QK side of an attribution graph: a score in terms of the graph's nodes, exact in float64.

The models and transcoder sets are those of tests/features/test_attribution_graph.py (a
LayerNorm model; RMSNorm with rotary and grouped queries; no norms; per-layer, skip and
cross-layer transcoders).
"""

import pytest
from test_attribution_graph import CASES, TOKENS, build

from analysis import qk_attribution
from analysis.attribution_graphs import attribution_graph, graph_qk_attribution

EXACT = 1e-10


def _graph(model_kind, set_kind):
    model, tcs = build(model_kind, set_kind)
    return model, tcs, attribution_graph(model, tcs, TOKENS, top_k=2)


@pytest.mark.parametrize(("model_kind", "set_kind"), CASES)
def test_the_terms_sum_to_the_score_the_model_computes(model_kind, set_kind):
    model, tcs, graph = _graph(model_kind, set_kind)
    _, cache = model.run_with_cache(TOKENS[None])
    for head, key in ((0, 8), (1, 3), (3, 0)):
        attribution = graph_qk_attribution(model, tcs, graph, 1, head, key, check=True)
        assert abs(attribution.sum() - attribution.score) < EXACT
        assert attribution.score == pytest.approx(
            float(cache["attn_scores", 1][0, head, -1, key]), abs=EXACT
        )


@pytest.mark.parametrize(("model_kind", "set_kind"), CASES)
def test_a_layers_mlp_row_is_its_features_b_dec_skip_and_error_rows(model_kind, set_kind):
    model, tcs, graph = _graph(model_kind, set_kind)
    _, cache = model.run_with_cache(TOKENS[None])
    by_nodes = graph_qk_attribution(model, tcs, graph, 1, 2, 4, query_pos=7)
    by_sublayers = qk_attribution(model, cache, 1, 2, 7, 4)
    for side, pos in (("query", 7), ("key", 4)):
        labels = getattr(by_nodes, f"{side}_labels")
        totals = getattr(by_nodes, f"{side}_totals")()
        parts = ("L0_b_dec", "L0_skip", f"L0.error@{pos}")
        mlp = [i for i, label in enumerate(labels) if label.startswith("L0.F") or label in parts]
        whole = getattr(by_sublayers, f"{side}_totals")()
        index = getattr(by_sublayers, f"{side}_labels").index("L0_mlp")
        assert float(totals[mlp].sum()) == pytest.approx(float(whole[index]), abs=EXACT)


def test_the_writers_are_named_as_the_graphs_nodes():
    model, tcs, graph = _graph("LN", "relu")
    attribution = graph_qk_attribution(model, tcs, graph, 1, 0, 5)
    nodes = {graph.label(node) for node in range(graph.n_nodes)}
    features = [label for label in attribution.key_labels if ".F" in label]
    assert features and all(label in nodes for label in features)
    assert all(label.endswith("@5") for label in features)
    assert attribution.key_labels[0] == graph.label(graph.token_node(5))
    assert "L0.error@5" in attribution.key_labels and "L0.error@5" in nodes
    assert attribution.query_labels[0] == graph.label(graph.token_node(graph.n_pos - 1))
