"""Exact edge patching: the ground truth every other scoring is measured against.

For each edge `s -> r`, one patched forward of the clean prompts in which receiver r's
input has sender s's clean term replaced by its corrupted term, and nothing else is
touched at r or before it; everything after r recomputes. Receiver r's input is then
`clean_input_r - clean_term_s + corrupted_term_s`, a fixed tensor, so every edge is one
variant of a patching sweep (`analysis.patching.engine.sweep`): the variants of one block
run together, stacked on the batch axis, from that block on (the earlier blocks are
clean); those of the last block's MLP or of the logits run that block alone.

A head's query, key or value receiver is patched where its projection passes (`hook_q`,
`hook_k`, `hook_v`, before any q/k norm or rotation): the patched input through the
block's `ln1` (its scale recomputed, as the forward would) and that head's weights.
That is the patched forward itself, without a per-head copy of the stream in every pass.

More in `docs/guide/discovery.md`.
"""

import torch
from einops import einsum
from jaxtyping import Int
from torch import Tensor

from analysis._reading import weight
from analysis.discovery._terms import Terms, sender_terms, split_model, term_hooks
from analysis.discovery.computational_graph import Graph
from analysis.discovery.scores import EdgeScores
from analysis.normalization import NormSite, normalize
from analysis.patching.engine import Edit, Metric, base_runs, sweep
from hookedattn.core.cache import ActivationCache
from hookedattn.core.model import HookedTransformer

# The patching engine's kinds of the MLPs' and the logits' inputs.
STREAM_KINDS = {"mlp": "mlp_in", "mixer": "mixer_in", "logits": "resid_post"}


def edge_patching(
    model: HookedTransformer,
    *,
    # [batch pos] token ids, loosely annotated so that bad input gets our own message.
    clean_tokens: object,
    corrupted_tokens: object,
    metric: Metric,
    memory_budget: int | None = None,
    metric_positions: object = None,
) -> EdgeScores:
    """The metric's exact change when each edge alone is patched (the module docstring).

    `metric` maps logits `[batch pos d_vocab]` to one value per prompt (`[batch]`).
    `memory_budget` (bytes) and `metric_positions` (the positions whose logits the metric
    reads: passes then stop at the last of them) are those of `activation_patch`. Runs on
    a copy of the model that shares its weights (with a hook point at each MLP's input);
    hooks attached to `model` do not run.
    """
    graph = Graph.from_model(model)
    split = split_model(model, qkv=False)
    names = sorted({*term_hooks(split), *_stream_hooks(graph)})
    runs = base_runs(split, clean_tokens, corrupted_tokens, metric, names, metric_positions)
    clean, corrupted = runs.clean, runs.corrupted
    delta = sender_terms(split, corrupted.cache, graph) - sender_terms(split, clean.cache, graph)
    edits = [_stream_edit(graph, clean.cache, hook, delta) for hook in _stream_hooks(graph)]
    edits += [
        _attention_edit(split, graph, clean.cache, layer, kind, delta)
        for layer in sorted({r.layer for r in graph.receivers if r.kind == "q"})
        for kind in ("q", "k", "v")
    ]
    per_prompt = sweep(
        split,
        clean,
        edits,
        len(graph),
        metric,
        runs.declared,
        memory_budget,
        lambda i: graph.edges[i].label,
    )
    return EdgeScores(
        graph, "edge patching", per_prompt - clean.metric, clean.metric, corrupted.metric
    )


def _stream_hooks(graph: Graph) -> list[str]:
    """The hook points of the receivers that read a whole stream: the MLPs, a hybrid's
    mixers, the logits."""
    return list(dict.fromkeys(r.hook for r in graph.receivers if r.kind in STREAM_KINDS))


def _rows(graph: Graph, at: list[int]) -> tuple[Int[Tensor, " edge"], tuple[int, ...]]:
    """Per edge, its sender's row in a table of the senders of receivers `at` (0 for
    edges into other receivers, whose masks are False), and those senders."""
    senders = graph.senders_of(at[0])  # the receivers of one hook point read the same
    row_of = {s: j for j, s in enumerate(senders)}
    rows = [row_of[e.sender] if e.receiver in at else 0 for e in graph.edges]
    return torch.tensor(rows), senders


def _stream_edit(graph: Graph, cache: ActivationCache, hook: str, delta: Terms) -> Edit:
    """An MLP's, a mixer's or the logits' input: each edge into it takes the clean input plus its
    sender's delta (one table row per sender)."""
    at = [i for i, r in enumerate(graph.receivers) if r.hook == hook]
    rows, senders = _rows(graph, at)
    table = cache[hook][None] + delta[list(senders)]
    mask = torch.tensor([e.receiver in at for e in graph.edges]).reshape(-1, 1, 1, 1)
    first = graph.receivers[at[0]]
    layer = graph.n_layers - 1 if first.kind == "logits" else first.layer
    return Edit(STREAM_KINDS[first.kind], layer, mask, table, rows.to(table.device))


def _attention_edit(
    model: HookedTransformer,
    graph: Graph,
    cache: ActivationCache,
    layer: int,
    kind: str,
    delta: Terms,
) -> Edit:
    """Every head's `kind` (q, k or v) of block `layer` as each of its edges makes it: the
    clean `resid_pre` plus the sender's delta, through `ln1`, projected by every head
    (one table row per sender); the mask picks the edge's head."""
    at = [i for i, r in enumerate(graph.receivers) if r.layer == layer and r.kind == kind]
    rows, senders = _rows(graph, at)
    stream = cache[f"blocks.{layer}.hook_resid_pre"][None] + delta[list(senders)]
    x = normalize(model, NormSite("ln1", layer), stream)
    # Whole weights: a tensor-parallel model's heads gathered from its ranks.
    if kind == "q":
        W, b = (model.layer_weight(layer, "attn", w) for w in ("W_Q", "b_Q"))
    else:
        W_K, b_K, W_V, b_V = model.key_value_weights(layer)
        W, b = (W_K, b_K) if kind == "k" else (W_V, b_V)
    table = einsum(x, weight(W, x), "s b p d_model, head d_model d_head -> s b p head d_head")
    table = table + weight(b, x)
    mask = torch.zeros(len(graph), 1, 1, W.shape[0], 1, dtype=torch.bool)
    for i, edge in enumerate(graph.edges):
        if edge.receiver in at:
            mask[i, 0, 0, graph.receivers[edge.receiver].head] = True
    return Edit(kind, layer, mask, table, rows.to(table.device))
