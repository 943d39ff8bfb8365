"""Edge scores against independent references: exact edge patching against one hooked
forward per edge, EAP and EAP-IG against exact patching where attribution is exact (a
linear model) and against finite differences where it is not."""

import json
import sys

import pytest
import torch
from helpers.edges import patched_logits
from helpers.families import FAMILIES, TOKENS, family_model

from analysis import (
    Graph,
    compare_edge_scores,
    edge_attribution,
    edge_patching,
    receiver_terms,
)
from analysis.discovery._terms import split_model, term_hooks
from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.testing import random_tiny_model

CORRUPTED = torch.randint(0, 23, TOKENS.shape, generator=torch.Generator().manual_seed(7))
PROMPTS = dict(clean_tokens=TOKENS, corrupted_tokens=CORRUPTED)


def metric(logits: torch.Tensor) -> torch.Tensor:
    """Linear in the logits, and reads more than one position."""
    return logits[:, -1, 3] - logits[:, 2:, 5].mean(1)


def linear_model() -> HookedTransformer:
    """Attention-only, no norms, and queries that see nothing (W_Q = b_Q = 0): every
    pattern is uniform over the causal prefix whatever the input, so the logits are
    linear in every receiver's input."""
    cfg = HookedTransformerConfig(
        n_layers=3,
        d_model=12,
        n_heads=3,
        d_head=4,
        n_ctx=16,
        d_vocab=23,
        attn_only=True,
        normalization_type=None,
        dtype=torch.float64,
        seed=0,
    )
    model = HookedTransformer(cfg)
    with torch.no_grad():
        generator = torch.Generator().manual_seed(3)
        for _name, param in model.named_parameters():
            param.copy_(torch.randn(param.shape, generator=generator, dtype=torch.float64) * 0.5)
        for block in model.blocks:
            block.attn.W_Q.zero_()
            block.attn.b_Q.zero_()
    return model


def terms_of(model, tokens):
    graph = Graph.from_model(model)
    split = split_model(model)
    inputs = sorted({r.hook for r in graph.receivers})
    with torch.no_grad():
        _, cache = split.run_with_cache(tokens, names_filter=[*term_hooks(split), *inputs])
    by_receiver = {r.label: receiver_terms(split, cache, r.label) for r in graph.receivers}
    return graph, split, by_receiver


def patched_metric(split, tokens, receiver, delta, stream=None):
    """One hooked forward: `delta` added to one receiver's input (its head's copy)."""
    return metric(patched_logits(split, tokens, receiver, delta, stream))


def loop_reference(model, edges: list[int]) -> torch.Tensor:
    """The definition, one forward per edge: the receiver's input plus the sender's
    corrupted term minus its clean term, read off each run's decomposition."""
    graph, split, clean = terms_of(model, TOKENS)
    _, _, corrupted = terms_of(model, CORRUPTED)
    with torch.no_grad():
        base = metric(split(TOKENS))
    out = []
    for edge in (graph.edges[i] for i in edges):
        receiver = graph.receivers[edge.receiver]
        sender = graph.senders[edge.sender].label
        delta = corrupted[receiver.label][sender] - clean[receiver.label][sender]
        out.append(patched_metric(split, TOKENS, receiver, delta) - base)
    return torch.stack(out)


@pytest.mark.parametrize("shape", ["tiny", *FAMILIES])
def test_edge_patching_is_one_forward_per_edge(shape):
    model = random_tiny_model(d_vocab=23) if shape == "tiny" else family_model(shape)
    exact = edge_patching(model, **PROMPTS, metric=metric)
    # Every 7th edge, and every edge into one key receiver and into the logits (the loop
    # is slow: a forward per edge).
    graph = exact.graph
    key = next(r.label for r in graph.receivers if r.kind == "k" and r.layer == 1)
    edges = sorted({*range(0, len(graph), 7), *graph.into(key), *graph.into("logits")})
    reference = loop_reference(model, edges)
    torch.testing.assert_close(exact.per_prompt[edges], reference, rtol=0, atol=1e-10)
    with torch.no_grad():
        torch.testing.assert_close(exact.clean, metric(model(TOKENS)), rtol=0, atol=1e-12)
        torch.testing.assert_close(exact.corrupted, metric(model(CORRUPTED)), rtol=0, atol=1e-12)


@pytest.mark.parametrize("method, steps", [("eap", None), ("eap-ig", 1), ("eap-ig", 3)])
def test_attribution_is_exact_where_the_model_is_linear(method, steps):
    model = linear_model()
    exact = edge_patching(model, **PROMPTS, metric=metric)
    approx = edge_attribution(model, **PROMPTS, metric=metric, method=method, ig_steps=steps)
    assert float(exact.per_prompt.abs().max()) > 0.1  # not a comparison of zeros
    torch.testing.assert_close(approx.per_prompt, exact.per_prompt, rtol=0, atol=1e-10)


def directional_derivative(split, receiver, delta, stream, eps=1e-5):
    """d metric / d t of the receiver's input plus t * delta, at t = 0, by central
    differences (float64: error about eps^2)."""
    up = patched_metric(split, TOKENS, receiver, eps * delta, stream)
    down = patched_metric(split, TOKENS, receiver, -eps * delta, stream)
    return (up - down) / (2 * eps)


@pytest.mark.parametrize("shape", ["gemma2", "neox"])
def test_eap_is_the_first_order_change_and_eap_ig_the_midpoint_gradient(shape):
    model = family_model(shape)
    eap = edge_attribution(model, **PROMPTS, metric=metric)
    ig = edge_attribution(model, **PROMPTS, metric=metric, method="eap-ig", ig_steps=1)
    graph, split, clean = terms_of(model, TOKENS)
    _, _, corrupted = terms_of(model, CORRUPTED)
    with torch.no_grad():
        _, a = split.run_with_cache(TOKENS, names_filter="blocks.0.hook_resid_pre")
        _, b = split.run_with_cache(CORRUPTED, names_filter="blocks.0.hook_resid_pre")
    midpoint = (a["blocks.0.hook_resid_pre"] + b["blocks.0.hook_resid_pre"]) / 2
    for label in ("L0H1 -> L1H2.q", "embed -> L0KV1.k", "L0H3 -> logits", "mlp0 -> L1KV0.v"):
        if label not in graph.labels:  # neox has no grouped key/value heads
            label = label.replace("KV", "H")
        edge = graph.edges[graph.index(label)]
        receiver = graph.receivers[edge.receiver]
        sender = graph.senders[edge.sender].label
        delta = corrupted[receiver.label][sender] - clean[receiver.label][sender]
        first_order = directional_derivative(split, receiver, delta, None)
        torch.testing.assert_close(
            eap.per_prompt[graph.index(label)], first_order, atol=1e-7, rtol=1e-6
        )
        at_midpoint = directional_derivative(split, receiver, delta, midpoint)
        torch.testing.assert_close(
            ig.per_prompt[graph.index(label)], at_midpoint, atol=1e-7, rtol=1e-6
        )


def test_eap_ig_averages_the_gradient_at_the_midpoints_of_its_steps():
    model = family_model("llama")
    ig = edge_attribution(model, **PROMPTS, metric=metric, method="eap-ig", ig_steps=2)
    graph, split, clean = terms_of(model, TOKENS)
    _, _, corrupted = terms_of(model, CORRUPTED)
    with torch.no_grad():
        _, a = split.run_with_cache(TOKENS, names_filter="blocks.0.hook_resid_pre")
        _, b = split.run_with_cache(CORRUPTED, names_filter="blocks.0.hook_resid_pre")
    a, b = a["blocks.0.hook_resid_pre"], b["blocks.0.hook_resid_pre"]
    label = "L0H2 -> L1KV1.k"
    edge = graph.edges[graph.index(label)]
    receiver = graph.receivers[edge.receiver]
    delta = corrupted[receiver.label]["L0H2"] - clean[receiver.label]["L0H2"]
    at = [directional_derivative(split, receiver, delta, a + t * (b - a)) for t in (0.25, 0.75)]
    torch.testing.assert_close(ig[label], float(sum(at).mean()) / 2, atol=1e-7, rtol=1e-6)


# ---------------------------------------------------------------- the result type


@pytest.fixture(scope="module")
def scores():
    return edge_patching(random_tiny_model(d_vocab=23), **PROMPTS, metric=metric)


def test_top_ranks_by_magnitude_and_filters_by_receiver(scores):
    magnitude = scores.scores.abs()
    top = scores.top(5)
    assert [row[0] for row in top] == [
        scores.labels[i] for i in magnitude.argsort(descending=True)[:5]
    ]
    into = scores.top(3, receiver="L1H2.k")
    assert all(row[2] == "L1H2.k" for row in into) and len(into) == 3
    assert into.rows[0][3] == scores[into.rows[0][0]]
    _label, _, _, value, normalised = top.rows[0]
    gap = scores.corrupted_baseline - scores.clean_baseline
    assert normalised == pytest.approx(value / gap)


def test_the_result_travels_as_json_and_columns(scores):
    data = json.loads(scores.to_json())
    assert data["method"] == "edge patching" and data["n_prompts"] == 2
    assert data["columns"]["edge"] == list(scores.labels)
    assert data["columns"]["score"] == pytest.approx(scores.scores.tolist())
    assert data["clean"] == pytest.approx(scores.clean_baseline)
    assert len(scores.to_table()) == len(scores.graph)


def test_a_dataframe_needs_pandas_and_says_so(scores, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)  # as if it were not installed
    with pytest.raises(ImportError, match="to_dict"):
        scores.to_dataframe()


def test_the_repr_and_the_notebook_table_name_the_top_edges(scores):
    first = scores.top(1).rows[0][0]
    assert first in repr(scores) and "edge patching" in repr(scores)
    assert first.replace(">", "&gt;") in scores._repr_html_()


def brute_spearman(a: list[float], b: list[float]) -> float:
    def ranks(x):
        order = sorted(range(len(x)), key=x.__getitem__)
        out = [0.0] * len(x)
        i = 0
        while i < len(x):
            j = i
            while j + 1 < len(x) and x[order[j + 1]] == x[order[i]]:
                j += 1
            for k in range(i, j + 1):
                out[order[k]] = (i + j) / 2
            i = j + 1
        return out

    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va = sum((x - ma) ** 2 for x in ra) ** 0.5
    vb = sum((y - mb) ** 2 for y in rb) ** 0.5
    return cov / (va * vb)


def test_agreement_is_spearmans_rank_correlation_and_the_top_overlap(scores):
    model = random_tiny_model(d_vocab=23)
    eap = edge_attribution(model, **PROMPTS, metric=metric)
    agreement = compare_edge_scores(eap, scores, k=10)
    a, e = eap.scores.tolist(), scores.scores.tolist()
    assert agreement.spearman == pytest.approx(brute_spearman(a, e), abs=1e-12)
    absolute = brute_spearman([abs(x) for x in a], [abs(x) for x in e])
    assert agreement.spearman_abs == pytest.approx(absolute, abs=1e-12)
    top = lambda x: set(sorted(range(len(x)), key=lambda i: -abs(x[i]))[:10])
    assert agreement.top_overlap == len(top(a) & top(e)) / 10
    assert compare_edge_scores(scores, scores).spearman == pytest.approx(1.0)


def test_ties_share_their_mean_rank():
    from analysis.discovery.scores import _ranks

    ranks = _ranks(torch.tensor([3.0, 1.0, 3.0, 2.0, 1.0], dtype=torch.float64))
    assert ranks.tolist() == [3.5, 0.5, 3.5, 2.0, 0.5]


# ---------------------------------------------------------------- bad input


@pytest.mark.parametrize("steps", [0, -2, 1.5, True])
def test_ig_steps_below_one_or_not_an_int_is_refused(steps):
    with pytest.raises(ValueError, match="ig_steps must be an int >= 1"):
        edge_attribution(linear_model(), **PROMPTS, metric=metric, method="eap-ig", ig_steps=steps)


def test_ig_steps_for_plain_eap_and_unknown_methods_are_refused():
    with pytest.raises(ValueError, match="is for method='eap-ig'"):
        edge_attribution(linear_model(), **PROMPTS, metric=metric, ig_steps=5)
    with pytest.raises(ValueError, match=r"method must be one of \('eap', 'eap-ig'\)"):
        edge_attribution(linear_model(), **PROMPTS, metric=metric, method="ig")


@pytest.mark.parametrize("score", [edge_patching, edge_attribution])
def test_prompts_of_different_shapes_are_refused(score):
    with pytest.raises(ValueError, match=r"clean tokens have shape \(2, 9\) but corrupted"):
        score(linear_model(), clean_tokens=TOKENS, corrupted_tokens=CORRUPTED[:, :8], metric=metric)


@pytest.mark.parametrize("score", [edge_patching, edge_attribution])
@pytest.mark.parametrize(
    "bad, error, message",
    [
        (lambda logits: logits[:, -1, 3].mean(), ValueError, r"drop a final \.mean\(\)"),
        (lambda logits: logits[:, :, 3], ValueError, r"shape \(2,\)"),
        (lambda logits: 1.0, TypeError, "one value per prompt"),
    ],
)
def test_a_metric_that_is_not_one_number_per_prompt_is_refused(score, bad, error, message):
    with pytest.raises(error, match=message):
        score(linear_model(), **PROMPTS, metric=bad)


def test_an_unknown_receiver_is_a_key_error_naming_the_closest(scores):
    with pytest.raises(KeyError, match="did you mean 'L1H2.q'"):
        scores.top(3, receiver="L1H2.Q")
    with pytest.raises(KeyError, match="no edge"):
        scores["L0H9 -> logits"]


def test_scores_of_different_graphs_cannot_be_compared(scores):
    other = edge_patching(linear_model(), **PROMPTS, metric=metric)
    with pytest.raises(ValueError, match="different graphs"):
        compare_edge_scores(other, scores)


def test_declared_positions_and_a_tiny_memory_budget_change_nothing():
    model = random_tiny_model(d_vocab=23)
    last = lambda logits: logits[:, -1, 3] - logits[:, -1, 5]
    prompts = dict(**PROMPTS, metric=last)
    full = edge_patching(model, **prompts)
    declared = edge_patching(model, **prompts, metric_positions=-1, memory_budget=1)
    torch.testing.assert_close(declared.per_prompt, full.per_prompt, rtol=0, atol=1e-12)
    ig = edge_attribution(model, **prompts, method="eap-ig", ig_steps=3)
    one_at_a_time = edge_attribution(model, **prompts, method="eap-ig", ig_steps=3, memory_budget=1)
    torch.testing.assert_close(one_at_a_time.per_prompt, ig.per_prompt, rtol=0, atol=1e-12)


def test_the_model_is_left_as_it_was_and_its_own_hooks_do_not_run():
    model = random_tiny_model(d_vocab=23)
    reference = edge_attribution(model, **PROMPTS, metric=metric)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    model.add_hook("blocks.0.hook_resid_post", lambda x, hook: x + 100.0)
    try:
        for scores in (
            edge_attribution(model, **PROMPTS, metric=metric),
            edge_attribution(model, **PROMPTS, metric=metric, method="eap-ig"),
        ):
            assert scores.per_prompt.shape == reference.per_prompt.shape
        again = edge_attribution(model, **PROMPTS, metric=metric)
        torch.testing.assert_close(again.per_prompt, reference.per_prompt, rtol=0, atol=0)
        assert len(model.blocks[0].hook_resid_post.fwd_hooks) == 1  # still attached
    finally:
        model.reset_hooks()
    for name, param in model.named_parameters():
        assert torch.equal(param, before[name]) and param.grad is None, name
