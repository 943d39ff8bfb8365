"""Circuits, faithfulness and ACDC: on a hand-built model whose every path is known, and
on every family's block shape against exact edge patching."""

import pytest
import torch
from helpers.families import FAMILIES, TOKENS, family_model
from helpers.linear_paths import CLEAN, CORRUPTED, hand_built, paths
from helpers.linear_paths import metric as last_logit

from analysis import (
    Circuit,
    Graph,
    acdc,
    edge_attribution,
    edge_patching,
    faithfulness,
    faithfulness_curve,
)
from analysis.discovery._circuit_run import circuit_metrics, prepare
from hookedattn.testing import random_tiny_model

TOL = dict(rtol=0, atol=1e-10)
PROMPTS = dict(clean_tokens=CLEAN, corrupted_tokens=CORRUPTED, metric=last_logit)
# S (L0H0) -> M (L1H0) -> R2 (L2H1) -> logits, and S -> R (L2H0) -> logits: the
# hand-built model's two paths (tests/helpers/linear_paths.py), edge by edge.
VIA_M = ("embed -> L0H0.v", "L0H0 -> L1H0.v", "L1H0 -> L2H1.v", "L2H1 -> logits")
VIA_R = ("embed -> L0H0.v", "L0H0 -> L2H0.v", "L2H0 -> logits")


def test_a_circuit_alone_computes_its_own_paths():
    model = hand_built()
    (d_clean, e_clean), (d_corrupted, e_corrupted) = paths(CLEAN), paths(CORRUPTED)
    circuit = Circuit.from_labels(Graph.from_model(model), VIA_M)
    result = faithfulness(model, circuit, **PROMPTS)
    # Outside the circuit everything carries the corrupted run's terms: R's write too.
    torch.testing.assert_close(result.circuit, d_corrupted + e_clean, **TOL)
    torch.testing.assert_close(result.empty, d_corrupted + e_corrupted, **TOL)
    torch.testing.assert_close(result.clean, d_clean + e_clean, **TOL)
    gap = (d_clean + e_clean).mean() - (d_corrupted + e_corrupted).mean()
    expected = ((d_corrupted + e_clean).mean() - (d_corrupted + e_corrupted).mean()) / gap
    assert result.value == pytest.approx(float(expected), abs=1e-12)


def test_mean_ablation_carries_the_corrupted_prompts_mean():
    model = hand_built()
    (_, e_clean), (d_corrupted, _) = paths(CLEAN), paths(CORRUPTED)
    circuit = Circuit.from_labels(Graph.from_model(model), VIA_M)
    result = faithfulness(model, circuit, **PROMPTS, ablation="mean")
    torch.testing.assert_close(result.circuit, d_corrupted.mean() + e_clean, **TOL)


def test_both_paths_together_are_the_whole_behaviour():
    model = hand_built()
    circuit = Circuit.from_labels(Graph.from_model(model), sorted({*VIA_M, *VIA_R}))
    assert faithfulness(model, circuit, **PROMPTS).value == pytest.approx(1.0, abs=1e-12)


def test_edge_patching_moves_one_path_only():
    model = hand_built()
    (d_clean, e_clean), (d_corrupted, e_corrupted) = paths(CLEAN), paths(CORRUPTED)
    exact = edge_patching(model, **PROMPTS)
    graph = exact.graph
    torch.testing.assert_close(
        exact.per_prompt[graph.index("L0H0 -> L2H0.v")], d_corrupted - d_clean, **TOL
    )
    torch.testing.assert_close(
        exact.per_prompt[graph.index("L0H0 -> L1H0.v")], e_corrupted - e_clean, **TOL
    )
    torch.testing.assert_close(
        exact.per_prompt[graph.index("L0H0 -> L2H1.v")], torch.zeros(2, dtype=torch.float64), **TOL
    )


def test_acdc_keeps_exactly_the_edges_of_both_paths():
    model = hand_built()
    circuit = acdc(model, **PROMPTS, threshold=1e-6)
    assert set(circuit.labels) == {*VIA_M, *VIA_R}
    # Each kept edge was tried, and its removal moved the metric by more than that.
    kept = [circuit.graph.index(label) for label in circuit.labels]
    assert bool((circuit.scores.scores[kept].abs() > 1e-6).all())


def test_a_threshold_above_every_effect_keeps_nothing():
    circuit = acdc(hand_built(), **PROMPTS, threshold=1e6)
    assert len(circuit) == 0 and circuit.labels == ()


def test_acdc_refuses_a_metric_that_is_nan():
    # abs(nan) < threshold is False: nothing would be pruned, the full graph returned.
    nan_metric = lambda logits: last_logit(logits) * float("nan")
    with pytest.raises(ValueError, match="the metric is not finite .* on the clean and corrupted"):
        acdc(hand_built(), clean_tokens=CLEAN, corrupted_tokens=CORRUPTED, metric=nan_metric,
             threshold=1e-6)  # fmt: skip


def test_acdc_refuses_a_model_with_a_nan_weight():
    model = hand_built()
    with torch.no_grad():
        model.blocks[2].attn.W_O[1, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="the metric is not finite"):
        acdc(model, **PROMPTS, threshold=1e-6)


@pytest.mark.parametrize("threshold", [float("nan"), -1.0])
def test_acdc_refuses_a_threshold_that_is_not_a_number_at_least_zero(threshold):
    with pytest.raises(ValueError, match="threshold must be a number >= 0"):
        acdc(hand_built(), **PROMPTS, threshold=threshold)


@pytest.mark.parametrize("method", ["acdc", "faithfulness", "edge_patching", "eap"])
def test_an_empty_set_of_prompts_is_refused(method):
    model = hand_built()
    empty = CLEAN[:0]
    prompts = dict(clean_tokens=empty, corrupted_tokens=empty, metric=last_logit)
    run = {
        "acdc": lambda: acdc(model, **prompts, threshold=1e-6),
        "faithfulness": lambda: faithfulness(
            model, Circuit.from_labels(Graph.from_model(model), VIA_M), **prompts
        ),
        "edge_patching": lambda: edge_patching(model, **prompts),
        "eap": lambda: edge_attribution(model, **prompts),
    }[method]
    with pytest.raises(ValueError, match=r"the clean prompts have shape \(0, \d+\)"):
        run()


def test_eap_refuses_a_metric_without_a_gradient():
    detached = lambda logits: last_logit(logits).detach()
    with pytest.raises(ValueError, match="the metric's value has no gradient"):
        edge_attribution(hand_built(), clean_tokens=CLEAN, corrupted_tokens=CORRUPTED,
                         metric=detached)  # fmt: skip


@pytest.mark.parametrize("shape", ["tiny", *FAMILIES])
def test_circuit_forwards_agree_with_edge_patching_on_every_family(shape):
    model = random_tiny_model(d_vocab=23) if shape == "tiny" else family_model(shape)
    corrupted = torch.randint(0, 23, TOKENS.shape, generator=torch.Generator().manual_seed(7))
    metric = lambda logits: logits[:, -1, 3] - logits[:, 2:, 5].mean(1)
    prompts = dict(clean_tokens=TOKENS, corrupted_tokens=corrupted, metric=metric)
    exact = edge_patching(model, **prompts)
    runs = prepare(model, TOKENS, corrupted, metric, "patch")
    n = len(runs.graph)
    chosen = list(range(0, n, 5))
    one_edge = torch.zeros(len(chosen), n, dtype=torch.bool)
    one_edge[range(len(chosen)), chosen] = True
    extremes = torch.stack([torch.zeros(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool)])
    values = circuit_metrics(runs, torch.cat([one_edge, extremes]), memory_budget=2**20)
    # A circuit of every edge but one is that edge patched alone.
    torch.testing.assert_close(values[:-2] - runs.clean, exact.per_prompt[chosen], **TOL)
    torch.testing.assert_close(values[-2], exact.clean, **TOL)  # every edge: the clean run
    torch.testing.assert_close(values[-1], exact.corrupted, **TOL)  # none: the corrupted run


def test_the_curve_is_the_faithfulness_of_each_top_circuit_and_of_random_ones():
    model = random_tiny_model(d_vocab=23)
    corrupted = torch.randint(0, 23, TOKENS.shape, generator=torch.Generator().manual_seed(7))
    metric = lambda logits: logits[:, -1, 3] - logits[:, -1, 5]
    prompts = dict(clean_tokens=TOKENS, corrupted_tokens=corrupted, metric=metric)
    scores = edge_attribution(model, **prompts)
    curve = faithfulness_curve(
        model, scores, **prompts, sizes=[0, 3, 12, len(scores)], n_random=3, seed=4
    )
    assert curve.sizes == (0, 3, 12, len(scores)) and curve.random.shape == (4, 3)
    for k, value in zip(curve.sizes, curve.faithfulness.tolist(), strict=True):
        alone = faithfulness(model, Circuit.top(scores, k), **prompts).value
        assert value == pytest.approx(alone, abs=1e-10)
    assert curve.faithfulness[0] == pytest.approx(0.0, abs=1e-12)
    assert curve.faithfulness[-1] == pytest.approx(1.0, abs=1e-12)
    torch.testing.assert_close(curve.random[0], torch.zeros(3, dtype=torch.float64), **TOL)
    again = faithfulness_curve(
        model, scores, **prompts, sizes=[0, 3, 12, len(scores)], n_random=3, seed=4
    )
    assert torch.equal(again.random, curve.random)  # seeded
    assert "random mean" in repr(curve)


def test_a_circuit_is_a_set_of_labelled_edges():
    model = hand_built()
    graph = Graph.from_model(model)
    circuit = Circuit.from_labels(graph, list(reversed(VIA_M)))
    assert circuit.labels == VIA_M  # in the graph's order
    assert len(circuit) == 4 and "L1H0 -> L2H1.v" in circuit and "L2H0 -> logits" not in circuit
    assert circuit.nodes() == (
        "embed",
        "L0H0",
        "L1H0",
        "L2H1",
        "L0H0.v",
        "L1H0.v",
        "L2H1.v",
        "logits",
    )
    assert int(circuit.mask.sum()) == 4 and list(circuit) == list(VIA_M)
    scores = edge_patching(model, **PROMPTS)
    top = Circuit.top(scores, 2)
    assert set(top.labels) == {scores.labels[i] for i in scores.order()[:2]}
    assert top.to_table().columns == ("edge", "score") and "chosen by edge patching" in repr(top)


# ---------------------------------------------------------------- bad input


def test_bad_circuits_and_settings_are_refused():
    model = hand_built()
    graph = Graph.from_model(model)
    scores = edge_patching(model, **PROMPTS)
    with pytest.raises(ValueError, match=r"k must be an int in 0\.\.\d+"):
        Circuit.top(scores, len(scores) + 1)
    with pytest.raises(KeyError, match="did you mean"):
        Circuit.from_labels(graph, ["L0H0 -> L1H0.V"])
    other = Circuit.from_labels(Graph.from_model(random_tiny_model()), ["embed -> L0H0.q"])
    with pytest.raises(ValueError, match="the circuit is of"):
        faithfulness(model, other, **PROMPTS)
    circuit = Circuit.from_labels(graph, VIA_M)
    with pytest.raises(ValueError, match=r"ablation must be one of \('patch', 'mean'\)"):
        faithfulness(model, circuit, **PROMPTS, ablation="zero")
    with pytest.raises(ValueError, match="threshold must be a number >= 0"):
        acdc(model, **PROMPTS, threshold=-0.1)
    with pytest.raises(ValueError, match="n_random must be an int >= 1"):
        faithfulness_curve(model, scores, **PROMPTS, n_random=0)
    with pytest.raises(ValueError, match="sizes must be a non-empty list of ints"):
        faithfulness_curve(model, scores, **PROMPTS, sizes=[3, 10_000])


def test_prompts_of_different_shapes_are_refused_by_the_circuit_forwards():
    model = hand_built()
    circuit = Circuit.from_labels(Graph.from_model(model), VIA_M)
    with pytest.raises(ValueError, match="clean tokens have shape"):
        faithfulness(
            model, circuit, clean_tokens=CLEAN, corrupted_tokens=CORRUPTED[:, :4], metric=last_logit
        )
