"""A model's computational graph as edges: who writes into the stream, who reads from it
(`Graph`; the discovery guide, `docs/guide/discovery.md`, draws one).

The residual stream is a sum (`analysis.decomposition`), so each (writer, reader) pair is
one term of what the reader reads: an *edge*. The writers (*senders*) and readers (*receivers*):

    senders    embed (the token embedding, with the learned positions where the model has
               them), each head's output L0H5, each MLP's output mlp0
    receivers  each head's query, key and value inputs L1H2.q, L1H2.k, L1H2.v, each MLP's
               input mlp1, and the logits (the final stream, through ln_final)
    edges      "L0H5 -> L1H2.k", "embed -> L0H5.q", "mlp0 -> logits"

A receiver reads every sender before it: a head in block L reads `resid_pre` of L (the
embedding, the heads and MLPs of blocks 0..L-1); a block's MLP reads `resid_mid` (its own
block's heads too), or in a parallel block (`parallel_attn_mlp`) `resid_pre` like the
heads; the logits read everything. With grouped-query attention a key/value head is read
once for its whole group, so it is one receiver, `L1KV0.k` (key/value head 0 of block 1),
with its senders counted once. What else is in a receiver's input (the attention's output
bias `b_O`, a norm's bias after a sublayer) is written by no sender, so it is no edge:
`receiver_terms` lists it beside the edges, labelled as `decompose_resid` labels it.

In a hybrid model a mixer in attention's place (`L0_mamba2`: its term's label in the
decomposition) is one node, as an MLP is: a sender (its write, `hook_attn_out`) and a
receiver (its input, `resid_pre`, passing `hook_mixer_in`). A block of an MLP alone
(Nemotron-H's) has an MLP that reads `resid_pre`. A mixer beside the attention
(Falcon-H1's) is refused by name.

Behind a norm after a sublayer (`ln1_post`: Gemma 2, OLMo 2) a head's term is its share of
the normed output at the divisor the run recorded, as in the decomposition: the shares and
the bias terms add up to the stream exactly, but b_O's share then moves with the divisor,
so that patching every edge into a receiver gives its corrupted input up to that change.
"""

import dataclasses
import difflib
import functools

import torch
from jaxtyping import Bool
from torch import Tensor

from analysis._naming import head_label
from hookedattn.core.model import HookedTransformer


@dataclasses.dataclass(frozen=True)
class Sender:
    """A writer into the stream: `embed`, a head (`L0H5`), a hybrid's mixer (`L0_mamba2`)
    or an MLP (`mlp0`).

    `order` places it in the forward: `(layer, 0)` for a head or a mixer, `(layer, 1)` for
    an MLP, `(-1, 1)` for the embedding; a receiver reads every sender before its `reads`.
    """

    label: str
    kind: str
    layer: int
    head: int | None
    order: tuple[int, int]


@dataclasses.dataclass(frozen=True)
class Receiver:
    """A reader of the stream: a head's q/k/v input, a mixer's or an MLP's input, or the
    logits.

    `head` is the query head of a `q` receiver and the key/value head of a `k` or `v` one
    (the same index without grouping); `hook` is the hook point where its input passes in
    a model with `use_split_qkv_input`, `use_hook_mlp_in` and `use_hook_mixer_in`
    (`analysis.discovery` runs such a copy, sharing the weights); `site` the stream it
    reads, before its norm; `reads` the order bound: it reads the senders whose `order`
    is below it.
    """

    label: str
    kind: str
    layer: int
    head: int | None
    hook: str
    site: str
    reads: tuple[int, int]


@dataclasses.dataclass(frozen=True)
class Edge:
    """One term of one receiver's input: `sender -> receiver` (indices into the graph)."""

    sender: int
    receiver: int
    label: str


@dataclasses.dataclass(frozen=True, repr=False)
class Graph:
    """Every edge of a model, in the forward's order of receivers, then of senders.

    Build one with `Graph.from_model(model)`. `graph.edges[i]` is edge i; results that
    score edges (`EdgeScores`) and circuits keep this order. `index("L0H5 -> L1H2.k")` is
    an edge's index; `into("L1H2.k")` the indices of a receiver's edges.
    """

    model_name: str
    n_layers: int
    n_heads: int
    n_kv_heads: int
    senders: tuple[Sender, ...]
    receivers: tuple[Receiver, ...]
    edges: tuple[Edge, ...]

    @classmethod
    def from_model(cls, model: HookedTransformer) -> "Graph":
        """The graph of `model`'s architecture (its weights play no part)."""
        if not isinstance(model, HookedTransformer):
            raise TypeError(f"expected a HookedTransformer, got {type(model).__name__}")
        cfg = model.cfg
        if cfg.n_layers == 0:
            raise ValueError(
                "a model with 0 layers has one edge, embed -> logits, and nothing to discover"
            )
        _refuse_mixers_beside_attention(cfg)
        cfg.require_one_attention_shape("the edge graph of circuit discovery", key_value=True)
        layout = tuple(_block_layout(cfg, layer) for layer in range(cfg.n_layers))
        senders = _senders(layout, cfg.n_heads)
        receivers = _receivers(layout, cfg.n_heads, cfg.n_kv_heads, cfg.parallel_attn_mlp)
        edges = tuple(
            Edge(s, r, f"{sender.label} -> {receiver.label}")
            for r, receiver in enumerate(receivers)
            for s, sender in enumerate(senders)
            if sender.order < receiver.reads
        )
        return cls(
            cfg.model_name, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, senders, receivers, edges
        )

    @property
    def labels(self) -> tuple[str, ...]:
        """Every edge's label, in the graph's order."""
        return tuple(e.label for e in self.edges)

    @functools.cached_property
    def _edge_index(self) -> dict[str, int]:
        return {e.label: i for i, e in enumerate(self.edges)}

    @functools.cached_property
    def _receiver_index(self) -> dict[str, int]:
        return {r.label: i for i, r in enumerate(self.receivers)}

    def __len__(self) -> int:
        return len(self.edges)

    def index(self, label: str) -> int:
        """The index of the edge `label` (`"L0H5 -> L1H2.k"`); a `KeyError` naming the
        closest labels if there is none."""
        try:
            return self._edge_index[label]
        except (KeyError, TypeError):
            raise KeyError(_unknown("edge", label, self.labels)) from None

    def receiver(self, label: str) -> int:
        """The index of the receiver `label` (`"L1H2.k"`, `"mlp0"`, `"logits"`)."""
        try:
            return self._receiver_index[label]
        except (KeyError, TypeError):
            raise KeyError(_unknown("receiver", label, tuple(self._receiver_index))) from None

    def into(self, receiver: str) -> tuple[int, ...]:
        """The indices of the edges into `receiver`, its senders in the forward's order."""
        r = self.receiver(receiver)
        return tuple(i for i, e in enumerate(self.edges) if e.receiver == r)

    def senders_of(self, receiver: int) -> tuple[int, ...]:
        """The sender indices that receiver index `receiver` reads."""
        reads = self.receivers[receiver].reads
        return tuple(i for i, s in enumerate(self.senders) if s.order < reads)

    def edge_mask(self, labels: object) -> Bool[Tensor, " edge"]:
        """A mask over the edges that is True at `labels` (edge labels or indices)."""
        if isinstance(labels, str):
            raise TypeError(f"give a collection of edge labels, not one string: [{labels!r}]")
        mask = torch.zeros(len(self.edges), dtype=torch.bool)
        for item in labels:
            index = item if isinstance(item, int) and not isinstance(item, bool) else None
            if index is None:
                index = self.index(item)
            elif not 0 <= index < len(self.edges):
                raise ValueError(f"edge index {index} is out of range 0..{len(self.edges) - 1}")
            mask[index] = True
        return mask

    def __repr__(self) -> str:
        return (
            f"Graph({self.model_name}: {len(self.senders)} senders, {len(self.receivers)} "
            f"receivers, {len(self.edges)} edges)"
        )


def _unknown(what: str, label: object, valid: tuple[str, ...]) -> str:
    # Compared in lower case, so that "L1H2.K" is closest to "L1H2.k", not to "L1H2.v".
    lower = {v.lower(): v for v in valid}
    close = difflib.get_close_matches(str(label).lower(), list(lower), n=3, cutoff=0.5)
    close = [lower[c] for c in close]
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    shown = ", ".join(valid[:6]) + (", ..." if len(valid) > 6 else "")
    return f"no {what} {label!r} in this graph{hint} ({len(valid)} {what}s: {shown})"


def _mlp_label(layer: int) -> str:
    """`"mlp{layer}"`, the label of an MLP as a sender and as a receiver."""
    return f"mlp{layer}"


def _mixer_label(layer: int, kind: str) -> str:
    """`"L{layer}_{kind}"` (`"L0_mamba2"`), the label of a hybrid's mixer as a sender and as
    a receiver: its term's label in `decompose_resid`."""
    return f"L{layer}_{kind}"


def _refuse_mixers_beside_attention(cfg: object) -> None:
    """A mixer beside the attention (Falcon-H1's) reads the heads' normed input: it would be
    one more receiver of the same hook point, which the graph does not model."""
    beside = cfg.mixers.beside_attention if cfg.mixers is not None else None
    if beside is not None:
        raise ValueError(
            f"the edge graph of circuit discovery models a mixer in attention's place, not "
            f"one beside it (this model's blocks hold a {beside!r} mixer beside their "
            f"attention: Falcon-H1's layout)"
        )


def _block_layout(cfg: object, layer: int) -> tuple[str, bool]:
    """What block `layer` holds: its sublayer that mixes positions ("attention", a mixer's
    kind, or "none" in an MLP-only block) and whether it holds an MLP."""
    return cfg.layer_mixer(layer), cfg.layer_has_mlp(layer)


def _senders(layout: tuple[tuple[str, bool], ...], n_heads: int) -> tuple[Sender, ...]:
    senders = [Sender("embed", "embed", -1, None, (-1, 1))]
    for layer, (mixing, has_mlp) in enumerate(layout):
        if mixing == "attention":
            senders += [
                Sender(head_label(layer, h), "head", layer, h, (layer, 0)) for h in range(n_heads)
            ]
        elif mixing != "none":
            senders.append(Sender(_mixer_label(layer, mixing), "mixer", layer, None, (layer, 0)))
        if has_mlp:
            senders.append(Sender(_mlp_label(layer), "mlp", layer, None, (layer, 1)))
    return tuple(senders)


def _head_receivers(layer: int, n_heads: int, n_kv_heads: int) -> list[Receiver]:
    """The query, key and value receivers of block `layer`'s heads."""
    reads, block = (layer, 0), f"blocks.{layer}"  # resid_pre: the blocks before this one
    receivers = [
        Receiver(f"{head_label(layer, h)}.q", "q", layer, h, f"{block}.hook_q_input",
                 "resid_pre", reads)
        for h in range(n_heads)
    ]  # fmt: skip
    for kind in ("k", "v"):
        for g in range(n_kv_heads):
            name = f"L{layer}KV{g}" if n_kv_heads != n_heads else head_label(layer, g)
            hook = f"{block}.hook_{kind}_input"
            receivers.append(Receiver(f"{name}.{kind}", kind, layer, g, hook, "resid_pre", reads))
    return receivers


def _receivers(
    layout: tuple[tuple[str, bool], ...], n_heads: int, n_kv_heads: int, parallel: bool
) -> tuple[Receiver, ...]:
    receivers = []
    for layer, (mixing, has_mlp) in enumerate(layout):
        reads, block = (layer, 0), f"blocks.{layer}"
        if mixing == "attention":
            receivers += _head_receivers(layer, n_heads, n_kv_heads)
        elif mixing != "none":
            label, hook = _mixer_label(layer, mixing), f"{block}.hook_mixer_in"
            receivers.append(Receiver(label, "mixer", layer, None, hook, "resid_pre", reads))
        if has_mlp:
            # In a parallel block, or one with an MLP alone, the MLP reads resid_pre.
            after = not parallel and mixing != "none"
            site, mlp_reads = ("resid_mid", (layer, 1)) if after else ("resid_pre", reads)
            hook = f"{block}.hook_mlp_in"
            receivers.append(Receiver(_mlp_label(layer), "mlp", layer, None, hook, site, mlp_reads))
    n_layers = len(layout)
    last = f"blocks.{n_layers - 1}.hook_resid_post"
    receivers.append(
        Receiver("logits", "logits", n_layers, None, last, "resid_post", (n_layers, 0))
    )
    return tuple(receivers)
