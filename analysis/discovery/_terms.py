"""What each sender wrote into the stream, and the copy of the model whose receivers have
hook points of their own.

A receiver's input is a sum of its senders' terms (`computational_graph` module
docstring); an edge's patch replaces one term. The terms come from the exact residual
decomposition (`decompose_resid(granularity="head")`): the embedding (with the learned
positions), each head's write (through a norm after the attention at the recorded
divisor), each MLP's output. The receivers' inputs pass hook points only in a model built with
`use_split_qkv_input` (per-head query, key and value inputs) and `use_hook_mlp_in`:
`split_model` builds one that shares the original's parameters, so nothing is copied and
the two give the same numbers.

More in `docs/guide/discovery.md`.
"""

import weakref

import torch
from jaxtyping import Float
from torch import Tensor

from analysis._resid_stack import Decomposition
from analysis.decomposition import decompose_resid
from analysis.discovery.computational_graph import Graph
from analysis.head_results import _written_z
from hookedattn.core import parallel
from hookedattn.core.cache import ActivationCache
from hookedattn.core.model import HookedTransformer
from hookedattn.core.names import get_act_name

Terms = Float[Tensor, "sender batch pos d_model"]


# The copies made so far, by model: building one costs more than a small model's forward.
_COPIES: "weakref.WeakKeyDictionary[HookedTransformer, dict[bool, HookedTransformer]]" = (
    weakref.WeakKeyDictionary()
)


def split_model(model: HookedTransformer, qkv: bool = True) -> HookedTransformer:
    """`model` with a hook point at every receiver's input, sharing its parameters.

    A hybrid's mixers' inputs pass `hook_mixer_in` (`use_hook_mixer_in`) in both.
    `qkv=False`: the MLPs' inputs only (`use_hook_mlp_in`), the attention reading one
    shared input (exact edge patching edits the heads' queries, keys and values, computed
    from the patched input, rather than their inputs: per-head copies of the stream in
    every patched pass would cost about a third of its time). Hooks attached to `model`
    are not attached to the copy; its weights are the same tensors. A copy is kept for
    the next call while the model's config and parameter objects stay the same.
    """
    cfg = model.cfg
    mixes = any(
        cfg.layer_mixer(layer) not in ("attention", "none") for layer in range(cfg.n_layers)
    )
    flags = dict(use_split_qkv_input=qkv, use_attn_in=False, use_hook_mlp_in=cfg.has_mlp,
                 use_hook_mixer_in=mixes)  # fmt: skip
    wanted = cfg.replace(**flags, init_weights=False)
    kept = _COPIES.setdefault(model, {}).get(qkv)
    if kept is None or kept.cfg != wanted or not _same_parameters(kept, model):
        # Always a copy, even where the flags are already set: the model's own hooks stay off.
        # The same Parameter objects, assigned rather than copied into fresh ones (on a
        # tensor-parallel model, this rank's slices, in a copy split as the model is).
        kept = parallel.sharing_parameters(HookedTransformer, model, wanted)
        _COPIES[model][qkv] = kept
    kept.tokenizer = model.tokenizer
    return kept.train(model.training)


def _same_parameters(copy: HookedTransformer, model: HookedTransformer) -> bool:
    mine = dict(model.named_parameters())
    theirs = dict(copy.named_parameters())
    return mine.keys() == theirs.keys() and all(mine[k] is theirs[k] for k in mine)


def term_hooks(model: HookedTransformer) -> list[str]:
    """The hook points whose activations the sender terms are computed from."""
    names = ["hook_embed", "hook_pos_embed"]
    for layer in range(model.cfg.n_layers):
        # A mixer's write is its block's attn_out (no block has both a mixer and heads here).
        written = "attn_out" if model.cfg.layer_mixer(layer) != "attention" else _written_z(model)
        names += [get_act_name(kind, layer) for kind in (written, "mlp_out")]
        names.append(f"blocks.{layer}.ln1_post.hook_scale")
    return [name for name in names if name in model.hook_dict]


def _decomposition_labels(graph: Graph, senders: tuple[int, ...]) -> list[tuple[str, ...]]:
    """Per sender, the labels of its terms in `decompose_resid(granularity="head")`."""
    out = []
    for sender in (graph.senders[i] for i in senders):
        if sender.kind == "embed":
            out.append(("embed", "pos_embed"))
        elif sender.kind == "mlp":
            out.append((f"L{sender.layer}_mlp",))
        else:
            out.append((sender.label,))
    return out


def graph_terms(
    decomposition: Decomposition, graph: Graph, senders: tuple[int, ...]
) -> tuple[Float[Tensor, "term batch pos d_model"], tuple[str, ...]]:
    """A decomposition's terms as the graph's: first one per sender of `senders` (the
    embedding's two terms summed), then the rest (biases) under their own labels."""
    where = {label: i for i, label in enumerate(decomposition.labels)}
    components, terms, used = decomposition.components, [], set()
    for labels in _decomposition_labels(graph, senders):
        present = [where[label] for label in labels if label in where]
        assert present, labels
        terms.append(components[present].sum(0))
        used |= set(present)
    rest = [i for i in range(len(decomposition.labels)) if i not in used]
    terms += [components[i] for i in rest]
    labels = tuple(graph.senders[i].label for i in senders)
    return torch.stack(terms), labels + tuple(decomposition.labels[i] for i in rest)


def sender_terms(model: HookedTransformer, cache: ActivationCache, graph: Graph) -> Terms:
    """Each sender's term of the final stream, in the graph's order of senders."""
    decomposition = decompose_resid(model, cache, None, granularity="head")
    every = tuple(range(len(graph.senders)))
    return graph_terms(decomposition, graph, every)[0][: len(every)]


def receiver_terms(
    model: HookedTransformer, cache: ActivationCache, receiver: str, *, check: bool = False
) -> Decomposition:
    """A receiver's input as its edges' terms and the biases, labelled (a `Decomposition`).

    The terms are one per sender the receiver reads (`embed`, `L0H5`, `mlp0`, in the
    forward's order; the embedding's token and position terms summed), then what no
    sender wrote (`L0_attn_bias`, a post-norm's bias), and sum to the stream the receiver
    reads before its norm (`resid_pre`, `resid_mid`, or the final stream for the logits)
    exactly; `check=True` compares the sum with the cached stream. `cache` needs what
    `decompose_resid(granularity="head")` needs: the embeddings, `hook_z`, `hook_mlp_out`
    and the scales of norms after the sublayers.
    """
    graph = Graph.from_model(model)
    r = graph.receivers[graph.receiver(receiver)]
    layer = model.cfg.n_layers - 1 if r.kind == "logits" else r.layer
    decomposition = decompose_resid(model, cache, layer, r.site, "head", check=check)
    terms, labels = graph_terms(decomposition, graph, graph.senders_of(graph.receiver(receiver)))
    return Decomposition(terms, labels, decomposition.site, decomposition.layer)
