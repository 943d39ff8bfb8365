"""The computational graph of every family's block shape: each edge once, and each
receiver's input exactly the sum of its senders' terms (float64, 1e-10)."""

import pytest
import torch
from helpers.families import FAMILIES, TOKENS, family_model

from analysis import Graph, receiver_terms
from analysis.discovery._terms import split_model, term_hooks
from hookedattn import HookedTransformer
from hookedattn.testing import random_tiny_model, tiny_model

SHAPES = ["tiny", "attn_only", *FAMILIES]


def model_of(shape: str) -> HookedTransformer:
    if shape == "tiny":
        return random_tiny_model(d_vocab=23)
    if shape == "attn_only":
        return random_tiny_model(d_vocab=23, attn_only=True)
    return family_model(shape)


@pytest.mark.parametrize("shape", SHAPES)
def test_every_receiver_reads_each_earlier_sender_once(shape):
    model = model_of(shape)
    graph = Graph.from_model(model)
    cfg = model.cfg
    assert len(set(graph.labels)) == len(graph.labels)
    for r, receiver in enumerate(graph.receivers):
        senders = [graph.senders[e.sender].label for e in graph.edges if e.receiver == r]
        expected = ["embed"]
        for layer in range(cfg.n_layers):
            own_block = receiver.kind == "mlp" and not cfg.parallel_attn_mlp
            if layer < receiver.layer or (own_block and layer == receiver.layer):
                expected += [f"L{layer}H{h}" for h in range(cfg.n_heads)]
            if cfg.has_mlp and layer < receiver.layer:
                expected.append(f"mlp{layer}")
        assert senders == expected, receiver.label


def test_grouped_keys_and_values_receive_once_per_key_value_head():
    graph = Graph.from_model(family_model("llama"))  # 4 query heads, 2 key/value heads
    receivers = [r.label for r in graph.receivers if r.layer == 1]
    assert receivers == [
        *(f"L1H{h}.q" for h in range(4)),
        "L1KV0.k",
        "L1KV1.k",
        "L1KV0.v",
        "L1KV1.v",
        "mlp1",
    ]
    assert len(graph.into("L1KV1.k")) == 1 + 4 + 1  # embed, L0's heads, mlp0


def test_a_parallel_blocks_mlp_reads_what_its_attention_reads():
    graph = Graph.from_model(family_model("neox"))
    into_mlp = [graph.edges[i].label for i in graph.into("mlp1")]
    assert into_mlp == [f"{s} -> mlp1" for s in ["embed", "L0H0", "L0H1", "L0H2", "L0H3", "mlp0"]]


def test_the_edge_count_of_a_sequential_model():
    model = tiny_model(n_heads=4)  # 2 layers with MLPs
    graph = Graph.from_model(model)
    # L0's 12 q/k/v inputs read embed; mlp0 reads embed and L0's 4 heads; L1's 12 read
    # those and mlp0; mlp1 reads everything before it but itself; the logits read all 11.
    assert len(graph) == 12 * 1 + 5 + 12 * 6 + 10 + 11
    assert graph.index("L0H3 -> L1H2.k") == graph.labels.index("L0H3 -> L1H2.k")


@pytest.mark.parametrize("shape", SHAPES)
def test_each_receivers_terms_sum_to_its_input(shape):
    model = split_model(model_of(shape))  # each q/k/v input has its own hook point
    graph = Graph.from_model(model)
    inputs = sorted({r.hook for r in graph.receivers})
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS, names_filter=[*term_hooks(model), *inputs])
    for r, receiver in enumerate(graph.receivers):
        terms = receiver_terms(model, cache, receiver.label)
        senders = [graph.senders[s].label for s in graph.senders_of(r)]
        assert terms.labels[: len(senders)] == tuple(senders)
        assert not set(terms.labels[len(senders) :]) & {s.label for s in graph.senders}
        seen = cache[receiver.hook]
        seen = seen[:, :, receiver.head] if receiver.head is not None else seen
        torch.testing.assert_close(terms.components.sum(0), seen, rtol=0, atol=1e-10)


def test_bad_labels_name_the_closest_ones():
    graph = Graph.from_model(tiny_model())
    with pytest.raises(KeyError, match="did you mean 'L1H2.k'"):
        graph.into("L1H2.K")
    with pytest.raises(KeyError, match="no receiver 'L7H0.q'"):
        graph.into("L7H0.q")
    with pytest.raises(KeyError, match="did you mean 'L0H1 -> L1H2.k'"):
        graph.index("L0H1 -> L1H2.K")
    with pytest.raises(TypeError, match="collection of edge labels"):
        graph.edge_mask("L0H1 -> L1H2.k")


def test_a_model_without_layers_has_no_graph_to_discover():
    with pytest.raises(ValueError, match="0 layers"):
        Graph.from_model(tiny_model(n_layers=0, attn_only=True))


def test_the_copy_with_receiver_hooks_shares_the_weights_and_the_numbers():
    model = random_tiny_model(d_vocab=23)
    split = split_model(model)
    assert split.cfg.use_split_qkv_input and split.cfg.use_hook_mlp_in
    assert split.blocks[1].attn.W_Q is model.blocks[1].attn.W_Q
    with torch.no_grad():
        torch.testing.assert_close(split(TOKENS), model(TOKENS), rtol=0, atol=1e-10)


def test_the_copy_is_kept_while_the_models_parameters_are_the_same_objects():
    model = random_tiny_model(d_vocab=23)
    first = split_model(model)
    assert split_model(model) is first
    with torch.no_grad():
        model.blocks[0].attn.W_Q.mul_(2.0)  # an edit in place is the copy's too
    assert split_model(model) is first
    model.blocks[0].attn.W_Q = torch.nn.Parameter(model.blocks[0].attn.W_Q.detach() * 3.0)
    second = split_model(model)
    assert second is not first and second.blocks[0].attn.W_Q is model.blocks[0].attn.W_Q
