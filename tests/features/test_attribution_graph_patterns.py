"""A frozen forward keeps each layer's queries and keys, not its pattern: the rows it makes
again are the forward's own pattern, whatever the block size; what it holds grows linearly
with the prompt; graphs made with one-row blocks are the graphs made with whole patterns."""

import dataclasses

import pytest
import torch

from analysis.attribution_graphs import _frozen, _rows, attribution_graph
from hookedattn.sae import Transcoder, TranscoderConfig, TranscoderSet
from hookedattn.testing import random_tiny_model, random_tokens

ATTENTIONS = {
    "plain": dict(),
    "rotary, grouped, q/k norms": dict(positional_embedding_type="rotary", rotary_dim=4,
                                       n_key_value_heads=2, use_qk_norm=True),
    "q/k norms after the rotation": dict(positional_embedding_type="rotary", rotary_dim=4,
                                         use_qk_norm=True, qk_norm_after_rotary=True),
    "soft cap, sinks": dict(attn_scores_soft_cap=2.0, use_attn_sinks=True),
    "local window": dict(window_size=3, attn_types=("local", "global")),
}  # fmt: skip


def build(n_ctx=16, **overrides):
    model = random_tiny_model(act_fn="gelu", n_ctx=n_ctx, **overrides)
    tcs = [Transcoder(TranscoderConfig(16, 48, 16, f"blocks.{layer}.ln2.hook_out",
                                       f"blocks.{layer}.hook_mlp_out", "topk", k=6,
                                       dtype="float64"))
           for layer in range(2)]  # fmt: skip
    torch.manual_seed(0)
    for tc in tcs:
        with torch.no_grad():
            for p in tc.parameters():
                p.add_(0.1 * torch.randn_like(p))
    return model, tcs


def frozen_tensors(value):
    """Every tensor a frozen forward holds (through its dataclasses and tuples)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for field in dataclasses.fields(value):
            yield from frozen_tensors(getattr(value, field.name))
    elif isinstance(value, tuple):
        for item in value:
            yield from frozen_tensors(item)


@pytest.mark.parametrize("kind", ATTENTIONS)
@pytest.mark.parametrize("pattern_bytes", [1, 2**20])
def test_the_rows_made_again_are_the_forwards_pattern(kind, pattern_bytes):
    model, tcs = build(**ATTENTIONS[kind])
    tokens = random_tokens(32, 1, 11, seed=2)[0]
    f = _frozen.freeze(model, TranscoderSet(tcs), tokens, pattern_bytes)
    _, cache = model.run_with_cache(tokens[None], names_filter=lambda n: "hook_pattern" in n)
    for layer, scores in enumerate(f.scores):
        assert scores.block_rows() == (1 if pattern_bytes == 1 else 11)
        pattern = cache[f"blocks.{layer}.attn.hook_pattern"][0]
        for start, stop in scores.blocks(torch.ones(11, dtype=torch.bool)):
            rows = scores.rows(start, stop)
            torch.testing.assert_close(rows, pattern[:, start:stop, :stop], rtol=0, atol=1e-14)
            assert not pattern[:, start:stop, stop:].any()


def test_what_a_frozen_forward_holds_grows_linearly_with_the_prompt():
    model, tcs = build(n_ctx=96, positional_embedding_type="rotary", rotary_dim=4)
    tset = TranscoderSet(tcs)
    held = {}
    for n in (24, 96):
        f = _frozen.freeze(model, tset, random_tokens(32, 1, n, seed=3)[0])
        tensors = list(frozen_tensors(f))
        assert not any(list(t.shape).count(n) > 1 for t in tensors)  # no [.. pos .. pos]
        held[n] = sum(t.numel() for t in tensors if n in t.shape)
    assert held[96] == 4 * held[24]


def test_blocks_skip_the_rows_where_no_target_reads():
    model, tcs = build()
    f = _frozen.freeze(model, TranscoderSet(tcs), random_tokens(32, 1, 10, seed=2)[0], 1)
    live = torch.zeros(10, dtype=torch.bool)
    live[[2, 5]] = True
    assert list(f.scores[0].blocks(live)) == [(5, 6), (2, 3)]  # the last first


@pytest.mark.parametrize("kind", ["rotary, grouped, q/k norms", "soft cap, sinks", "local window"])
def test_one_row_blocks_give_the_same_rows_and_the_rows_sum_to_what_each_node_reads(kind):
    model, tcs = build(**ATTENTIONS[kind])
    tokens = random_tokens(32, 1, 12, seed=4)[0]
    whole = _rows.prepare(model, tcs, tokens, None, 3, False, False, pattern_bytes=2**30)
    one = _rows.prepare(model, tcs, tokens, None, 3, False, False, pattern_bytes=1)
    n_nodes, chunk = whole.n_nodes, torch.arange(len(whole.g.features))[-5:]
    for p in (whole, one):
        rows = _rows.logit_rows(p.g, p.targets, n_nodes), _rows.feature_rows(p.g, chunk, n_nodes)
        if p is whole:
            expected = rows
    for (A, bias), (A_whole, bias_whole) in zip(rows, expected, strict=True):
        torch.testing.assert_close(A, A_whole, rtol=0, atol=1e-12)
        torch.testing.assert_close(bias, bias_whole, rtol=0, atol=1e-12)
    graph = attribution_graph(model, tcs, tokens, top_k=3)
    with torch.no_grad():
        logits = model.run_with_cache(tokens[None], names_filter=[])[0]
    expected = logits[0, -1, graph.logit_tokens]
    reads = graph.adjacency[graph.logit_node(0) :].sum(-1) + graph.bias[graph.logit_node(0) :]
    torch.testing.assert_close(reads, expected, rtol=0, atol=1e-10)
