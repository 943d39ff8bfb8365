"""Circuit discovery on hybrid models: a mixer in attention's place is one node, a sender
(its write, `hook_attn_out`) and a receiver (its input, `hook_mixer_in`), as an MLP is.

Every score is checked against references written here from the model's own hook points:
the sender terms read off the cache (the embedding, each head's `z @ W_O`, each mixer's and
MLP's write), one hooked forward per edge on a copy of the model built with the receivers'
hook points, and central differences for EAP (float64)."""

import dataclasses
import functools

import pytest
import torch
from einops import einsum

from analysis import Graph, acdc, activation_patch, edge_attribution, edge_patching, view
from analysis.discovery._circuit_run import circuit_metrics, prepare
from analysis.patching._components import component_grid
from analysis.patching._reference import reference_sweep
from hookedattn import HookedTransformer
from hookedattn.core.mixer_config import MixerConfig
from hookedattn.testing import random_tokens
from tests.helpers.edges import patched_logits
from tests.helpers.mixers import SETTINGS, hybrid_cfg, random_hybrid

BATCH, N_POS = 2, 6
EXACT = dict(rtol=0.0, atol=1e-10)
CLEAN, CORRUPTED = (random_tokens(23, BATCH, N_POS, seed) for seed in (1, 2))
LAYOUTS = {
    "mixers around attention": (("mamba2", "attention", "short_conv"), None),
    "delta rule then attention": (("gated_delta", "attention"), None),
    # The first block attention: the sweep's cost is measured on a one-block stand-in.
    "attention then delta rule": (("attention", "gated_delta"), None),
    # Nemotron-H: one sublayer per block, the MLPs in blocks of their own.
    "one sublayer per block": (("mamba2", "none", "attention", "none"), (False, True, False, True)),
}


def metric(logits: torch.Tensor) -> torch.Tensor:
    """Reads more than one position, so that edges into earlier positions count."""
    return logits[:, -1, 3] - logits[:, 2:, 5].mean(1)


@functools.cache
def _model(layout: str) -> HookedTransformer:
    kinds, mlp_layers = LAYOUTS[layout]
    cfg = hybrid_cfg(kinds)
    if mlp_layers is not None:
        cfg = cfg.replace(mixers=MixerConfig(layers=kinds, mlp_layers=mlp_layers, **SETTINGS))
    return random_hybrid(cfg, 3)


def _with_inputs(model: HookedTransformer) -> HookedTransformer:
    """The same weights in a model whose every receiver's input passes a hook point."""
    flags = dict(use_split_qkv_input=True, use_hook_mlp_in=True, use_hook_mixer_in=True)
    copy = HookedTransformer(model.cfg.replace(**flags))
    copy.load_state_dict(model.state_dict())
    return copy


def _sender_terms(model: HookedTransformer, tokens: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each sender's write, by label, read off one run's cache (no norm after a sublayer
    here, so a head's write is its `z @ W_O`)."""
    _, cache = model.run_with_cache(tokens)
    terms = {"embed": cache["hook_embed"]}
    for layer in range(model.cfg.n_layers):
        kind = model.cfg.layer_mixer(layer)
        if kind == "attention":
            z, W_O = cache[f"blocks.{layer}.attn.hook_z"], model.blocks[layer].attn.W_O
            heads = einsum(z, W_O, "b p head d_head, head d_head d_model -> head b p d_model")
            terms |= {f"L{layer}H{h}": heads[h] for h in range(model.cfg.n_heads)}
        elif kind != "none":
            terms[f"L{layer}_{kind}"] = cache[f"blocks.{layer}.hook_attn_out"]
        if model.cfg.layer_has_mlp(layer):
            terms[f"mlp{layer}"] = cache[f"blocks.{layer}.hook_mlp_out"]
    return terms


def _patched(model: HookedTransformer, receiver, delta: torch.Tensor, stream=None):
    """The metric of one forward of the clean prompts (or of `stream`, entering block 0)
    with `delta` added to one receiver's input."""
    return metric(patched_logits(model, CLEAN, receiver, delta, stream))


def _edge_deltas(model: HookedTransformer, graph: Graph):
    """Per edge, its receiver and its sender's corrupted term minus its clean term."""
    clean, corrupted = _sender_terms(model, CLEAN), _sender_terms(model, CORRUPTED)
    for edge in graph.edges:
        sender = graph.senders[edge.sender].label
        yield graph.receivers[edge.receiver], corrupted[sender] - clean[sender]


def test_a_mixer_is_one_sender_and_one_receiver_of_the_stream():
    graph = Graph.from_model(_model("mixers around attention"))
    assert [s.label for s in graph.senders] == [
        "embed", "L0_mamba2", "mlp0", "L1H0", "L1H1", "L1H2", "mlp1", "L2_short_conv", "mlp2",
    ]  # fmt: skip
    mixer = graph.receivers[graph.receiver("L2_short_conv")]
    assert (mixer.kind, mixer.hook, mixer.site) == ("mixer", "blocks.2.hook_mixer_in", "resid_pre")
    into = [graph.edges[i].label for i in graph.into("L2_short_conv")]
    assert into == [f"{s} -> L2_short_conv" for s in
                    ("embed", "L0_mamba2", "mlp0", "L1H0", "L1H1", "L1H2", "mlp1")]  # fmt: skip
    # Brute force: every receiver reads each sender of an earlier sublayer once.
    expected = sum(s.order < r.reads for r in graph.receivers for s in graph.senders)
    assert len(graph) == expected == 60


def test_an_mlp_in_a_block_of_its_own_reads_the_stream_entering_the_block():
    graph = Graph.from_model(_model("one sublayer per block"))
    assert [graph.edges[i].label for i in graph.into("mlp1")] == [
        "embed -> mlp1", "L0_mamba2 -> mlp1",
    ]  # fmt: skip
    assert graph.receivers[graph.receiver("mlp1")].site == "resid_pre"
    assert "L1H0.q" not in {r.label for r in graph.receivers}  # block 1 holds an MLP alone


def test_a_mixer_beside_the_attention_is_refused_by_name():
    kinds = ("attention", "attention")
    mixers = MixerConfig(layers=kinds, beside_attention="mamba2", **SETTINGS)
    model = HookedTransformer(dataclasses.replace(hybrid_cfg(kinds), mixers=mixers))
    with pytest.raises(ValueError, match="beside their attention: Falcon-H1"):
        Graph.from_model(model)


def test_a_model_of_mixers_alone_has_a_graph_of_them():
    model = random_hybrid(
        hybrid_cfg(("mamba2", "short_conv")).replace(attn_only=True, gated_mlp=False), 3
    )
    graph = Graph.from_model(model)
    assert graph.labels == (
        "embed -> L0_mamba2", "embed -> L1_short_conv", "L0_mamba2 -> L1_short_conv",
        "embed -> logits", "L0_mamba2 -> logits", "L1_short_conv -> logits",
    )  # fmt: skip


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_edge_patching_of_a_hybrid_is_one_forward_per_edge(layout):
    model = _model(layout)
    exact = edge_patching(model, clean_tokens=CLEAN, corrupted_tokens=CORRUPTED, metric=metric)
    hooked = _with_inputs(model)
    with torch.no_grad():
        base = metric(model(CLEAN))
    expected = torch.stack(
        [_patched(hooked, r, delta) - base for r, delta in _edge_deltas(model, exact.graph)]
    )
    assert float(expected.abs().max()) > 0.1  # not a comparison of zeros
    torch.testing.assert_close(exact.per_prompt, expected, **EXACT)


@pytest.mark.parametrize("layout", ["mixers around attention", "one sublayer per block"])
def test_eap_of_a_hybrid_is_the_first_order_change(layout):
    model = _model(layout)
    eap = edge_attribution(model, clean_tokens=CLEAN, corrupted_tokens=CORRUPTED, metric=metric)
    hooked, graph, eps = _with_inputs(model), eap.graph, 1e-5
    kinds = [(graph.senders[e.sender].kind, graph.receivers[e.receiver].kind) for e in graph.edges]
    mixer_edges = [i for i, pair in enumerate(kinds) if "mixer" in pair]
    assert mixer_edges
    deltas = list(_edge_deltas(model, graph))
    for i in mixer_edges:
        receiver, delta = deltas[i]
        slope = _patched(hooked, receiver, eps * delta) - _patched(hooked, receiver, -eps * delta)
        torch.testing.assert_close(eap.per_prompt[i], slope / (2 * eps), rtol=1e-6, atol=1e-7)


def test_eap_ig_of_a_hybrid_is_the_gradient_at_the_midpoint():
    model = _model("delta rule then attention")
    ig = edge_attribution(model, clean_tokens=CLEAN, corrupted_tokens=CORRUPTED, metric=metric,
                          method="eap-ig", ig_steps=1)  # fmt: skip
    hooked, graph, eps = _with_inputs(model), ig.graph, 1e-5
    with torch.no_grad():
        streams = [hooked.run_with_cache(t, names_filter="blocks.0.hook_resid_pre")[1]
                   for t in (CLEAN, CORRUPTED)]  # fmt: skip
    midpoint = sum(c["blocks.0.hook_resid_pre"] for c in streams) / 2
    deltas = list(_edge_deltas(model, graph))
    for label in (
        "embed -> L0_gated_delta",
        "L0_gated_delta -> L1H2.k",
        "L0_gated_delta -> logits",
    ):
        i = graph.index(label)
        receiver, delta = deltas[i]
        up = _patched(hooked, receiver, eps * delta, midpoint)
        down = _patched(hooked, receiver, -eps * delta, midpoint)
        torch.testing.assert_close(ig.per_prompt[i], (up - down) / (2 * eps), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_circuit_forwards_of_a_hybrid_agree_with_edge_patching(layout):
    model = _model(layout)
    exact = edge_patching(model, clean_tokens=CLEAN, corrupted_tokens=CORRUPTED, metric=metric)
    runs = prepare(model, CLEAN, CORRUPTED, metric, "patch")
    n = len(runs.graph)
    one_edge = torch.eye(n, dtype=torch.bool)
    extremes = torch.stack([torch.zeros(n, dtype=torch.bool), torch.ones(n, dtype=torch.bool)])
    values = circuit_metrics(runs, torch.cat([one_edge, extremes]), memory_budget=2**20)
    # A circuit of every edge but one is that edge patched alone.
    torch.testing.assert_close(values[:-2] - runs.clean, exact.per_prompt, **EXACT)
    torch.testing.assert_close(values[-2], exact.clean, **EXACT)  # every edge: the clean run
    torch.testing.assert_close(values[-1], exact.corrupted, **EXACT)  # none: the corrupted run


def test_acdc_tries_a_mixers_edges_and_prunes_through_its_node():
    model = _model("mixers around attention")
    prompts = dict(clean_tokens=CLEAN, corrupted_tokens=CORRUPTED, metric=metric)
    exact = edge_patching(model, **prompts)
    circuit = acdc(model, **prompts, threshold=0.05)
    graph = circuit.graph
    # The logits are tried first, against the full circuit: each edge patched alone.
    into = list(graph.into("logits"))
    torch.testing.assert_close(circuit.scores.per_prompt[into], exact.per_prompt[into], **EXACT)
    # A node none of whose writes is kept loses the edges into it without a forward.
    for node in ("L0_mamba2", "L2_short_conv"):
        out = [i for i, e in enumerate(graph.edges) if graph.senders[e.sender].label == node]
        if not any(graph.labels[i] in circuit for i in out):
            assert not any(graph.labels[i] in circuit for i in graph.into(node))
    assert 0 < len(circuit) < len(graph)


def test_a_mixers_input_hook_point_edits_what_it_reads_and_not_the_skip():
    plain = _model("mixers around attention")
    model = HookedTransformer(plain.cfg.replace(use_hook_mixer_in=True))
    model.load_state_dict(plain.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(model(CLEAN), plain(CLEAN), rtol=0, atol=0)
        zeroed = lambda x, hook: x.zero_()  # in place: the copy takes it, not the stream
        with model.hooks(fwd_hooks=[("blocks.0.hook_mixer_in", zeroed)]):
            _, cache = model.run_with_cache(CLEAN)
        _, before = plain.run_with_cache(CLEAN)
    skip = cache["blocks.0.hook_resid_mid"] - cache["blocks.0.hook_attn_out"]
    torch.testing.assert_close(skip, cache["blocks.0.hook_resid_pre"], rtol=0, atol=1e-12)
    changed = cache["blocks.0.hook_attn_out"] - before["blocks.0.hook_attn_out"]
    assert float(changed.abs().max()) > 1e-3


def test_a_mixers_input_hook_point_needs_a_mixer():
    with pytest.raises(ValueError, match=r"use_hook_mixer_in=True .* \(blocks: \['attention'\]\)"):
        hybrid_cfg(("attention",)).replace(use_hook_mixer_in=True)


def test_activation_patching_of_a_mixers_input_matches_the_reference():
    model = _with_inputs(_model("mixers around attention"))
    _, cache = model.run_with_cache(CLEAN)
    for by_pos in (True, False):
        prompts = dict(clean_tokens=CLEAN, corrupted_tokens=CORRUPTED)
        result = activation_patch(model, "mixer_in", **prompts, metric=metric, by_pos=by_pos)
        assert result.labels[0] == ("0", "2")  # the blocks that hold a mixer
        components = component_grid(model, "mixer_in", N_POS, by_pos).components
        expected = reference_sweep(model, CORRUPTED, cache, components, metric)
        torch.testing.assert_close(result.per_prompt.reshape(-1, BATCH), expected, **EXACT)


def test_the_circuit_page_draws_a_mixer_as_one_box_in_its_blocks_row():
    model = _model("mixers around attention")
    exact = edge_patching(model, clean_tokens=CLEAN, corrupted_tokens=CORRUPTED, metric=metric)
    data = view.circuit(exact).data
    labels = [node["label"] for node in data["nodes"]]
    rows = dict(zip(labels, (node["row"] for node in data["nodes"]), strict=True))
    assert labels == ["embed", "L0_mamba2", "mlp0", "L1H0", "L1H1", "L1H2", "mlp1",
                      "L2_short_conv", "mlp2", "logits"]  # fmt: skip
    assert rows["L0_mamba2"] == 1 and rows["mlp0"] == 2 and rows["L2_short_conv"] == 5
    edge = data["edges"][exact.graph.index("L1H2 -> L2_short_conv")]
    assert (labels[edge["from"]], labels[edge["to"]], edge["port"]) == ("L1H2", "L2_short_conv", "")
