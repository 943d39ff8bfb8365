"""The QK side of an attribution graph: one attention score in terms of the graph's nodes.

A graph freezes the patterns (`attribution_graph`); `graph_qk_attribution` opens one score
of its prompt with the writers of the stream named as the graph names its nodes. In the
replacement model (transcoders in place of the MLPs, error terms kept: the model's own
forward), the stream entering layer L at a position p is

    resid_pre[L][p] = tok@p + Σ_{l<L} (Σ_h L{l}H{h} + L{l}_attn_bias
                                       + Σ_f L{s}.F{f}@p + L{l}_b_dec + L{l}_skip + L{l}.error@p)

the token's embedding (with its positional embedding), each earlier head's result and
attention bias, each active feature's write (`act · W_dec`; a cross-layer feature's writes
to every layer below L summed), each transcoder's decoder bias and skip term, and the error
node. `analysis.qk_attribution._attribution_of_writers` carries these through `ln1`, the
projections, q/k norms and rotation with the divisors frozen, so the terms sum exactly to
the score (before any soft cap), feature against feature: Kamath et al. 2025's "QK
attributions" of circuit-tracer's attention follow-up, exact here.
"""

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from analysis._reading import activation, weight
from analysis.attribution_graphs import _frozen
from analysis.attribution_graphs.attribution_graph import AttributionGraph
from analysis.attribution_graphs.streaming import PrunedAttributionGraph
from analysis.head_results import head_results
from analysis.qk_attribution import QKAttribution, _attribution_of_writers, _StreamWriters, _where
from hookedattn.core.cache import ActivationCache
from hookedattn.core.model import HookedTransformer
from hookedattn.sae import TranscoderSet, replaced, transcoder_hook_name


def graph_qk_attribution(
    model: HookedTransformer,
    transcoders: Any,  # as for attribution_graph: a TranscoderSet, a list, a cross-layer one
    graph: AttributionGraph | PrunedAttributionGraph,
    layer: int,
    head: int,
    key_pos: int,
    query_pos: int = -1,
    *,
    check: bool = False,
) -> QKAttribution:
    """The score of head `head` of `layer` from `query_pos` (the graph's position, the last,
    by default) to `key_pos` of the graph's prompt, as terms of writers labelled as the
    graph's nodes (`L1.F42@7`, `L0.error@3`, `tok 'a'@2`) and the heads, biases and skip
    terms between them (module docstring). `graph` may be dense or pruned while computed
    (`pruned_attribution_graph`); `transcoders` are the graph's; `check` as for
    `qk_attribution`. Their terms sum to the score to float rounding.
    """
    tset = TranscoderSet(transcoders)
    _frozen.check_model(model, tset)
    with replaced(model, tset), torch.no_grad():
        _, cache = model.run_with_cache(graph.tokens[None])
    where = _where(model, cache, layer, head, query_pos, key_pos, 0)
    sides = tuple(
        _node_writers(model, tset, cache, graph, where.layer, pos)
        for pos in (where.query_pos, where.key_pos)
    )
    return _attribution_of_writers(model, cache, where, sides, check=check)


def _node_writers(
    model: HookedTransformer,
    tset: TranscoderSet,
    cache: ActivationCache,
    graph: AttributionGraph | PrunedAttributionGraph,
    layer: int,
    pos: int,
) -> _StreamWriters:
    """What wrote the stream entering `layer` at `pos`, in the replacement model's terms."""
    token = activation(cache, "blocks.0.hook_resid_pre")[0, pos]
    vectors: list[Float[Tensor, " d_model"]] = [token]
    labels = [graph.label(graph.token_node(pos))]
    features: dict[tuple[int, int], Tensor] = {}  # (source layer, feature) -> its write
    for block in range(layer):
        results = head_results(model, cache, block)[0, pos]
        vectors += [*results, weight(model.blocks[block].attn.b_O, token)]
        labels += [f"L{block}H{h}" for h in range(len(results))] + [f"L{block}_attn_bias"]
        for source in tset.sources(block):
            acts = activation(cache, transcoder_hook_name(source, "hook_acts"))[0, pos]
            W_dec = weight(tset.decoder(source, block), token)
            for feature in acts.nonzero().flatten().tolist():
                write = acts[feature] * W_dec[feature]
                key = (source, feature)
                features[key] = features[key] + write if key in features else write
        vectors.append(weight(tset.b_dec(block), token))
        labels.append(f"L{block}_b_dec")
        W_skip = tset.W_skip(block)
        if W_skip is not None:
            x = activation(cache, transcoder_hook_name(block, "hook_in"))[0, pos]
            vectors.append(weight(W_skip, token) @ x)
            labels.append(f"L{block}_skip")
        vectors.append(activation(cache, transcoder_hook_name(block, "hook_error"))[0, pos])
        labels.append(f"L{block}.error@{pos}")
    for (source, feature), write in sorted(features.items()):
        vectors.append(write)
        labels.append(f"L{source}.F{feature}@{pos}")
    return _StreamWriters(torch.stack(vectors), tuple(labels))
