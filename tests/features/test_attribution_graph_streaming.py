"""The pruned graph computed in chunks under a memory budget: `prune_graph` of the dense
graph, to rounding, whatever the chunks; its stored rows still sum to what they read."""

import pytest
import torch
from helpers.attribution_cases import TOKENS, build

from analysis.attribution_graphs import (
    attribution_graph,
    prune_graph,
    pruned_attribution_graph,
    streaming,
)
from analysis.attribution_graphs._budget import memory_budget
from hookedattn.sae import (
    TranscoderSet,
)

SMALL = 48 * 2**10  # bytes: a few targets a sweep on these models (checked below)
CASES = [
    ("LN", "skip topk"),
    ("RMS, rotary, grouped", "cross-layer topk"),
    ("no norms", "jumprelu"),
]


@pytest.mark.parametrize("model_kind, set_kind", CASES)
@pytest.mark.parametrize("thresholds", [(0.8, 0.98), (0.98, 0.99)])
def test_the_chunked_pruned_graph_is_the_pruned_dense_graph(model_kind, set_kind, thresholds):
    model, tcs = build(model_kind, set_kind)
    dense = prune_graph(attribution_graph(model, tcs, TOKENS, top_k=3), *thresholds)
    streamed = pruned_attribution_graph(model, tcs, TOKENS, top_k=3, memory_budget=SMALL,
                                        node_threshold=thresholds[0],
                                        edge_threshold=thresholds[1], progress=False)  # fmt: skip
    graph = dense.graph
    assert streamed.targets_per_sweep <= 4 and streamed.sweeps > graph.n_features // 4
    torch.testing.assert_close(streamed.influence, dense.influence, rtol=0, atol=1e-10)
    torch.testing.assert_close(
        streamed.cumulative_influence, dense.cumulative_influence, rtol=0, atol=1e-10
    )
    nodes, rows = streamed.nodes, streamed.nodes[streamed.rows]
    torch.testing.assert_close(
        streamed.adjacency, graph.adjacency[rows][:, nodes], rtol=0, atol=1e-10
    )
    assert torch.equal(streamed.kept_nodes(), dense.node_mask.nonzero().flatten())
    assert torch.equal(streamed.edge_mask, dense.edge_mask[rows][:, nodes])
    assert streamed.n_edges == dense.n_edges > 0
    assert streamed.kept_features() == dense.kept_features()
    for name in ("fraction_explained", "edge_fraction_explained", "error_fraction"):
        assert getattr(streamed, name) == pytest.approx(getattr(dense, name), abs=1e-10)


@pytest.mark.parametrize("model_kind, set_kind", CASES)
def test_pattern_rows_made_one_at_a_time_give_the_pruned_dense_graph(
    model_kind, set_kind, monkeypatch
):
    monkeypatch.setattr(streaming, "PATTERN_SHARE", SMALL)  # a block of 1 byte: one row
    model, tcs = build(model_kind, set_kind)
    dense = prune_graph(attribution_graph(model, tcs, TOKENS, top_k=3))
    streamed = pruned_attribution_graph(model, tcs, TOKENS, top_k=3, memory_budget=SMALL,
                                        progress=False)  # fmt: skip
    nodes, rows = streamed.nodes, streamed.nodes[streamed.rows]
    torch.testing.assert_close(
        streamed.adjacency, dense.graph.adjacency[rows][:, nodes], rtol=0, atol=1e-10
    )
    torch.testing.assert_close(streamed.influence, dense.influence, rtol=0, atol=1e-10)
    assert torch.equal(streamed.kept_nodes(), dense.node_mask.nonzero().flatten())
    assert torch.equal(streamed.edge_mask, dense.edge_mask[rows][:, nodes])


@pytest.mark.parametrize("model_kind, set_kind", CASES)
def test_a_stored_rows_edges_rest_and_bias_sum_to_what_it_reads(model_kind, set_kind):
    model, tcs = build(model_kind, set_kind)
    streamed = pruned_attribution_graph(model, tcs, TOKENS, top_k=3, memory_budget=SMALL,
                                        progress=False)  # fmt: skip
    tset = TranscoderSet(tcs)
    with torch.no_grad():
        logits, cache = model.run_with_cache(TOKENS[None])  # the plain model, no replacement
    totals = streamed.adjacency.sum(-1) + streamed.rest + streamed.bias
    assert streamed.rest.abs().sum() > 0  # some edges come from nodes not kept
    for total, node in zip(totals.tolist(), streamed.nodes[streamed.rows].tolist(), strict=True):
        if node < streamed.n_features:
            layer, pos, feature = streamed.features[node].tolist()
            x = cache[tset.input_hook(layer)][0, pos]
            W_enc, b_enc = (p.detach() for p in tset.encoder(layer))
            expected = float(x @ W_enc[:, feature] + b_enc[feature])
        else:
            token = streamed.logit_tokens[node - streamed.logit_node(0)]
            expected = float(logits[0, -1, token])
        assert abs(total - expected) < 1e-10, (streamed.label(node), total, expected)
    assert streamed.row(streamed.logit_node(1)) == len(streamed.rows) - 2
    with pytest.raises(KeyError, match="not stored"):
        streamed.row(streamed.token_node(0))


def test_the_budget_changes_the_chunks_not_the_graph():
    model, tcs = build("LN", "skip topk")
    small = pruned_attribution_graph(model, tcs, TOKENS, memory_budget=SMALL, progress=False)
    large = pruned_attribution_graph(model, tcs, TOKENS, memory_budget="1GiB", progress=False)
    assert large.memory_budget == 2**30 and small.memory_budget == SMALL
    assert large.sweeps == 2 * 2 + 1  # each layer's features in one sweep, twice; the logits
    assert small.sweeps > 4 * large.sweeps
    torch.testing.assert_close(small.adjacency, large.adjacency, rtol=0, atol=1e-12)
    torch.testing.assert_close(small.influence, large.influence, rtol=0, atol=1e-12)
    assert torch.equal(small.edge_mask, large.edge_mask)


def test_max_feature_nodes_keeps_the_most_influential_features():
    model, tcs = build("LN", "skip topk")
    full = pruned_attribution_graph(model, tcs, TOKENS, node_threshold=0.99, progress=False)
    capped = pruned_attribution_graph(model, tcs, TOKENS, node_threshold=0.99,
                                      max_feature_nodes=5, progress=False)  # fmt: skip
    features = full.nodes[full.nodes < full.n_features]
    assert len(features) > 5
    kept = capped.nodes[capped.nodes < capped.n_features]
    best = features[full.influence[features].argsort(descending=True)[:5]]
    assert sorted(kept.tolist()) == sorted(best.tolist())
    assert len(capped.rows) == 5 + len(capped.logit_tokens)


def test_memory_budgets_are_read_and_bad_ones_refused():
    cpu = torch.device("cpu")
    assert memory_budget("2GiB", cpu) == 2 * 2**30
    assert memory_budget("1.5 MB", cpu) == 1_500_000
    assert memory_budget(4096, cpu) == 4096
    assert memory_budget(None, cpu) > 0
    for bad in ("2 parsecs", "-1GiB", 0, True, 2.5):
        with pytest.raises(ValueError, match="GiB") as info:
            memory_budget(bad, cpu)
        assert repr(bad) in str(info.value)
    model, tcs = build("LN", "skip topk")
    with pytest.raises(ValueError, match="too small for this prompt"):
        pruned_attribution_graph(model, tcs, TOKENS, memory_budget=1024, progress=False)
    with pytest.raises(ValueError, match="max_feature_nodes"):
        pruned_attribution_graph(model, tcs, TOKENS, max_feature_nodes=0, progress=False)


def test_circuit_tracers_conventions_give_the_same_pruned_graph_both_ways():
    model, tcs = build("LN", "skip topk")
    flags = dict(demean_logits=True, drop_first_position=True)
    graph = attribution_graph(model, tcs, TOKENS, top_k=3, **flags)
    dense = prune_graph(graph, 0.95, 0.99)
    streamed = pruned_attribution_graph(model, tcs, TOKENS, top_k=3, node_threshold=0.95,
                                        edge_threshold=0.99, memory_budget=SMALL,
                                        progress=False, **flags)  # fmt: skip
    assert streamed.demeaned_logits and streamed.dropped_first_position
    torch.testing.assert_close(streamed.influence, dense.influence, rtol=0, atol=1e-10)
    assert torch.equal(streamed.kept_nodes(), dense.node_mask.nonzero().flatten())
    rows = streamed.nodes[streamed.rows]
    assert torch.equal(streamed.edge_mask, dense.edge_mask[rows][:, streamed.nodes])
    totals = streamed.adjacency.sum(-1) + streamed.rest + streamed.bias
    torch.testing.assert_close(totals, graph.adjacency[rows].sum(-1) + graph.bias[rows],
                               rtol=0, atol=1e-10)  # fmt: skip
