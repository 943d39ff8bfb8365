"""Attribution graphs: every edge exact, every target's edges summing to what it reads,
interventions moving the logits as the graph says; pruning and the JSON export."""

import json
import math

import pytest
import torch
from helpers.attribution_cases import (
    MODELS,
    SETS,
    TOKENS,
    build,
    model_of,
    per_layer,
)

from analysis.attribution_graphs import (
    FeatureIntervention,
    attribution_graph,
    graph_json,
    influence,
    intervene,
    normalized_adjacency,
    prune_graph,
)
from hookedattn.core.names import get_act_name
from hookedattn.sae import (
    TranscoderSet,
    replaced,
    transcoder_hook_name,
)
from hookedattn.testing import random_tiny_model

CASES = [(m, s) for m in MODELS for s in SETS]


@pytest.fixture(scope="module")
def standard():
    model, tcs = build("LN", "skip topk")
    return model, tcs, attribution_graph(model, tcs, TOKENS, top_k=3)


# ---------------------------------------------------------------------- exactness
@pytest.mark.parametrize("model_kind, set_kind", CASES)
def test_a_features_incoming_edges_sum_to_its_pre_activation(model_kind, set_kind):
    model, tcs = build(model_kind, set_kind)
    graph = attribution_graph(model, tcs, TOKENS, top_k=2, batch_size=16)
    tset = TranscoderSet(tcs)
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS[None])  # the plain model, no replacement
    for node, (layer, pos, feature) in enumerate(graph.features.tolist()):
        x = cache[tset.input_hook(layer)][0, pos]
        W_enc, b_enc = (p.detach() for p in tset.encoder(layer))
        pre = x @ W_enc[:, feature] + b_enc[feature]
        total = graph.adjacency[node].sum() + graph.bias[node]
        assert abs(float(total - pre)) < 1e-10, (graph.label(node), float(total), float(pre))


@pytest.mark.parametrize("model_kind, set_kind", CASES)
def test_the_edges_into_a_logit_sum_to_the_logit_less_its_frozen_bias_terms(model_kind, set_kind):
    model, tcs = build(model_kind, set_kind)
    graph = attribution_graph(model, tcs, TOKENS, top_k=4)
    logits = model(TOKENS[None])[0, -1, graph.logit_tokens]
    rows = [graph.logit_node(i) for i in range(4)]
    direct = graph.adjacency[rows].sum(-1)
    torch.testing.assert_close(direct, logits - graph.bias[rows], rtol=0, atol=1e-10)


def frozen_gradient(model, tcs, source, target, graph):
    """d target / d α where source's write is scaled by α, at α = 1, through the model's own
    forward (autograd) with the patterns, norm scales, error terms and every other feature
    held at their clean values: the direct effect an edge claims."""
    tset = TranscoderSet(tcs)
    n = model.cfg.n_layers
    names = [get_act_name("pattern", i) for i in range(n)]
    names += [f"blocks.{i}.{w}.hook_scale" for i in range(n) for w in ("ln1", "ln2")]
    names += ["ln_final.hook_scale"] + [transcoder_hook_name(i, h) for i in range(n)
                                         for h in ("hook_acts", "hook_error")]  # fmt: skip
    with replaced(model, tset), torch.no_grad():
        _, clean = model.run_with_cache(TOKENS[None], names_filter=lambda k: k in names)
    alpha = torch.ones((), dtype=torch.float64, requires_grad=True)
    hooks = [(k, lambda a, hook: clean[hook.name].detach()) for k in names if k in clean]
    kind = "feature" if source < graph.n_features else "other"
    if kind == "feature":
        layer, pos, feature = graph.features[source].tolist()

        def scaled_feature(a, hook):
            scale = torch.ones_like(a)
            scale[0, pos, feature] = alpha
            return clean[hook.name] * scale

        hooks.append((transcoder_hook_name(layer, "hook_acts"), scaled_feature))
    elif source < graph.token_node(0):
        layer, pos = divmod(source - graph.n_features, graph.n_pos)

        def scaled_error(e, hook):
            scale = torch.ones_like(e)
            scale[0, pos] = alpha
            return clean[hook.name] * scale

        hooks.append((transcoder_hook_name(layer, "hook_error"), scaled_error))
    else:
        pos = source - graph.token_node(0)

        def scaled_token(r, hook):
            scale = torch.ones_like(r)
            scale[0, pos] = alpha
            return r * scale

        hooks.append(("blocks.0.hook_resid_pre", scaled_token))
    seen = {}
    hooks.append((transcoder_hook_name(0, "hook_in"), lambda x, hook: seen.setdefault(0, x)))
    hooks.append((transcoder_hook_name(1, "hook_in"), lambda x, hook: seen.setdefault(1, x)))
    with replaced(model, tset), model.hooks(fwd_hooks=hooks):
        logits = model(TOKENS[None])
    if target < graph.n_features:
        t_layer, t_pos, t_feature = graph.features[target].tolist()
        W_enc, b_enc = tset.encoder(t_layer)
        value = seen[t_layer][0, t_pos] @ W_enc[:, t_feature] + b_enc[t_feature]
    else:
        value = logits[0, -1, graph.logit_tokens[target - graph.logit_node(0)]]
    (grad,) = torch.autograd.grad(value, alpha, allow_unused=True)
    return 0.0 if grad is None else float(grad)


def test_each_edge_is_the_direct_effect_through_the_frozen_model(standard):
    model, tcs, graph = standard
    layer1 = (graph.features[:, 0] == 1).nonzero().flatten()
    layer0 = (graph.features[:, 0] == 0).nonzero().flatten()
    logit = graph.logit_node(0)
    pairs = [(int(layer1[0]), int(layer0[-1])), (logit, int(layer0[0])), (logit, int(layer1[-1])),
             (int(layer1[3]), graph.error_node(0, 4)), (logit, graph.error_node(1, 8)),
             (int(layer1[5]), graph.token_node(2)), (logit, graph.token_node(8)),
             (int(layer0[2]), graph.token_node(0))]  # fmt: skip
    for target, source in pairs:
        expected = frozen_gradient(model, tcs, source, target, graph)
        assert abs(float(graph.adjacency[target, source]) - expected) < 1e-10, (
            graph.label(target), graph.label(source)
        )  # fmt: skip
    assert any(graph.adjacency[t, s] != 0 for t, s in pairs)


def test_the_batch_size_does_not_change_the_graph(standard):
    model, tcs, graph = standard
    one = attribution_graph(model, tcs, TOKENS, top_k=3, batch_size=1)
    assert one.backward_batches == graph.n_features + 3 and graph.backward_batches < 10
    torch.testing.assert_close(one.adjacency, graph.adjacency, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------- interventions
@pytest.mark.parametrize("set_kind", ["skip topk", "cross-layer topk", "jumprelu"])
def test_a_small_intervention_moves_the_logits_by_the_graphs_total_effect(set_kind):
    model, tcs = build("LN", set_kind)
    graph = attribution_graph(model, tcs, TOKENS, top_k=3)
    effects = graph.total_effects()
    base = intervene(model, tcs, TOKENS, [], freeze=True)[-1, graph.logit_tokens]
    eps = 1e-6
    for node in (0, graph.n_features // 2, graph.n_features - 1):
        layer, pos, feature = graph.features[node].tolist()
        value = float(graph.activations[node]) * (1 + eps)
        moved = intervene(model, tcs, TOKENS, [FeatureIntervention(layer, pos, feature, value)],
                          freeze=True)[-1, graph.logit_tokens]  # fmt: skip
        torch.testing.assert_close((moved - base) / eps, effects[:, node], rtol=1e-5, atol=1e-7)


def test_with_the_other_features_held_an_intervention_moves_a_logit_by_its_edge(standard):
    model, tcs, graph = standard
    rows = [graph.logit_node(i) for i in range(3)]
    base = intervene(model, tcs, TOKENS, [], freeze=True, freeze_features=True)
    for node in (1, graph.n_features - 2):
        layer, pos, feature = graph.features[node].tolist()
        step = FeatureIntervention(layer, pos, feature, 1.5 * float(graph.activations[node]))
        moved = intervene(model, tcs, TOKENS, [step], freeze=True, freeze_features=True)
        change = (moved - base)[-1, graph.logit_tokens] / 0.5
        torch.testing.assert_close(change, graph.adjacency[rows, node], rtol=0, atol=1e-10)


def test_the_frozen_model_without_interventions_is_the_model(standard):
    model, tcs, _ = standard
    expected = model(TOKENS[None])[0]
    torch.testing.assert_close(intervene(model, tcs, TOKENS, [], freeze=True), expected)
    torch.testing.assert_close(intervene(model, tcs, TOKENS, []), expected)


def test_ablating_a_feature_in_the_running_model_is_what_the_hook_does(standard):
    model, tcs, graph = standard
    layer, pos, feature = graph.features[0].tolist()
    ablated = intervene(model, tcs, TOKENS, [FeatureIntervention(layer, pos, feature, 0.0)])

    def zero(acts, hook):
        acts = acts.clone()
        acts[0, pos, feature] = 0.0
        return acts

    with replaced(model, tcs), model.hooks([(transcoder_hook_name(layer, "hook_acts"), zero)]):
        expected = model(TOKENS[None])[0]
    torch.testing.assert_close(ablated, expected, rtol=0, atol=0)


# ---------------------------------------------------------------------- the graph's shape
def test_nodes_come_in_circuit_tracers_order(standard):
    _, _, graph = standard
    assert graph.features.tolist() == sorted(graph.features.tolist())
    assert graph.error_node(0, 0) == graph.n_features
    assert graph.token_node(0) == graph.n_features + 2 * graph.n_pos
    assert graph.logit_node(2) == graph.n_nodes - 1
    layer, pos, feature = graph.features[5].tolist()
    assert graph.feature_node(layer, pos, feature) == 5
    assert graph.label(5) == f"L{layer}.F{feature}@{pos}"
    assert graph.label(graph.error_node(1, 3)) == "L1.error@3"
    # sources only have no incoming edges; features read only earlier layers' features
    assert not graph.adjacency[graph.error_node(0, 0) : graph.logit_node(0)].any()
    first_layer = graph.features[:, 0] == 0
    assert not graph.adjacency[: graph.n_features][first_layer][:, : graph.n_features].any()


def test_the_targets_are_the_logits_asked_for(standard):
    model, tcs, graph = standard
    probabilities = model(TOKENS[None])[0, -1].softmax(-1)
    assert graph.logit_tokens.tolist() == probabilities.topk(3).indices.tolist()
    chosen = attribution_graph(model, tcs, TOKENS, logits=[7, 2])
    assert chosen.logit_tokens.tolist() == [7, 2]
    torch.testing.assert_close(chosen.logit_probabilities, probabilities[[7, 2]])
    with pytest.raises(ValueError, match="logits must be token ids in 0..31"):
        attribution_graph(model, tcs, TOKENS, logits=[32])


def test_unsupported_models_are_refused():
    tcs = per_layer()
    with pytest.raises(ValueError, match="parallel blocks"):
        attribution_graph(random_tiny_model(parallel_attn_mlp=True), tcs, TOKENS)
    with pytest.raises(ValueError, match="norms before the sublayers only"):
        attribution_graph(random_tiny_model(normalization_placement="pre_and_post"), tcs, TOKENS)
    with pytest.raises(ValueError, match="replaces every MLP"):
        attribution_graph(model_of("LN"), tcs[:1], TOKENS)
    with pytest.raises(ValueError, match="a graph needs one of"):
        attribution_graph(model_of("LN"), per_layer(reads="hook_resid_pre"), TOKENS)


def test_a_graph_larger_than_its_budget_is_refused_with_its_size(standard):
    model, tcs, graph = standard
    needed = graph.n_nodes**2 * 8  # float64
    with pytest.raises(ValueError, match=rf"{graph.n_nodes:,} nodes: .* more than .*max_bytes"):
        attribution_graph(model, tcs, TOKENS, top_k=3, max_bytes=needed - 1)
    at_budget = attribution_graph(model, tcs, TOKENS, top_k=3, max_bytes=needed)
    assert torch.equal(at_budget.adjacency, graph.adjacency)
    with pytest.raises(ValueError, match="max_bytes must be a positive int"):
        attribution_graph(model, tcs, TOKENS, max_bytes=0)


# ---------------------------------------------------------------------- pruning
def test_influence_is_the_sum_over_paths(standard):
    _, _, graph = standard
    A_hat = normalized_adjacency(graph.adjacency)
    weights = torch.zeros(graph.n_nodes, dtype=torch.float64)
    weights[graph.logit_node(0) :] = graph.logit_probabilities
    eye = torch.eye(graph.n_nodes, dtype=torch.float64)
    dense = weights @ (torch.linalg.inv(eye - A_hat) - eye)
    torch.testing.assert_close(influence(A_hat, weights, 6), dense, rtol=1e-10, atol=1e-12)


def test_the_sources_share_all_the_influence(standard):
    _, _, graph = standard
    pruned = prune_graph(graph)
    sources = pruned.influence[graph.n_features : graph.logit_node(0)].sum()
    assert float(sources) == pytest.approx(float(graph.logit_probabilities.sum()), rel=1e-10)
    errors = pruned.influence[graph.n_features : graph.token_node(0)].sum()
    assert pruned.error_fraction == pytest.approx(float(errors / sources))


@pytest.mark.parametrize("threshold", [0.5, 0.8, 0.95])
def test_pruning_keeps_the_most_influential_nodes_and_says_how_much_they_hold(standard, threshold):
    _, _, graph = standard
    pruned = prune_graph(graph, node_threshold=threshold, edge_threshold=0.99)
    kept, infl = pruned.node_mask, pruned.influence
    logits = graph.logit_node(0)
    assert kept[graph.token_node(0) :].all()  # tokens and logits always stay
    assert pruned.fraction_explained == pytest.approx(
        float(infl[:logits][kept[:logits]].sum() / infl[:logits].sum())
    )
    dropped = ~kept[: graph.token_node(0)]
    if dropped.any() and kept[: graph.token_node(0)].any():
        # no dropped feature or error node beats every kept one... unless it lost its edges
        assert (
            infl[: graph.token_node(0)][kept[: graph.token_node(0)]].max()
            >= infl[: graph.token_node(0)][dropped].min()
        )
    for node in kept[: graph.n_features].nonzero().flatten().tolist():
        assert pruned.edge_mask[node].any() and pruned.edge_mask[:, node].any()
    assert not pruned.edge_mask[~kept].any() and not pruned.edge_mask[:, ~kept].any()


def test_a_looser_threshold_keeps_more(standard):
    _, _, graph = standard
    small, large = prune_graph(graph, 0.5), prune_graph(graph, 0.95)
    assert small.n_nodes <= large.n_nodes and small.fraction_explained <= large.fraction_explained
    with pytest.raises(ValueError, match=r"node_threshold must be a number in \[0, 1\]"):
        prune_graph(graph, 1.5)


# ---------------------------------------------------------------------- the JSON export
def test_the_json_is_circuit_tracers_graph_format(standard):
    _, _, graph = standard
    pruned = prune_graph(graph, 0.8)
    doc = json.loads(json.dumps(graph_json(graph, pruned, slug="test"), allow_nan=False))
    assert set(doc) == {"metadata", "qParams", "nodes", "links"}
    meta = doc["metadata"]
    assert meta["slug"] == "test" and meta["schema_version"] == 1
    assert meta["prompt_tokens"] == list(graph.token_strings) and meta["node_threshold"] == 0.8
    assert meta["hookedattn"]["fraction_explained"] == pruned.fraction_explained
    ids = [n["node_id"] for n in doc["nodes"]]
    assert len(ids) == len(set(ids)) == pruned.n_nodes
    fields = {"node_id", "feature", "layer", "ctx_idx", "feature_type", "token_prob",
              "is_target_logit", "run_idx", "reverse_ctx_idx", "jsNodeId", "clerp",
              "influence", "activation"}  # fmt: skip
    assert all(set(n) == fields for n in doc["nodes"])
    by_id = {n["node_id"]: n for n in doc["nodes"]}
    kinds = {n["feature_type"] for n in doc["nodes"]}
    assert kinds <= {"cross layer transcoder", "mlp reconstruction error", "embedding", "logit"}
    assert [n["is_target_logit"] for n in doc["nodes"] if n["feature_type"] == "logit"] == [
        True, False, False
    ]  # fmt: skip
    node = pruned.kept_features()[0]
    layer, pos, feature = graph.features[node].tolist()
    entry = by_id[f"{layer}_{feature}_{pos}"]
    assert entry["feature"] == (layer + feature) * (layer + feature + 1) // 2 + feature
    assert entry["activation"] == float(graph.activations[node])
    assert len(doc["links"]) == pruned.n_edges
    index = {graph_json_id: i for i, graph_json_id in enumerate(_ids(graph))}
    for link in doc["links"]:
        assert link["source"] in by_id and link["target"] in by_id
        weight = graph.adjacency[index[link["target"]], index[link["source"]]]
        assert link["weight"] == float(weight) and math.isfinite(link["weight"])


def _ids(graph):
    """Every node's id, in node order, written independently of the exporter."""
    ids = [f"{layer}_{f}_{p}" for layer, p, f in graph.features.tolist()]
    ids += [f"{layer}_-1_{p}" for layer in range(graph.n_layers) for p in range(graph.n_pos)]
    ids += [f"E_{t}_{p}" for p, t in enumerate(graph.tokens.tolist())]
    ids += [f"{graph.n_layers + 1}_{t}_{graph.n_pos - 1}" for t in graph.logit_tokens.tolist()]
    return ids
