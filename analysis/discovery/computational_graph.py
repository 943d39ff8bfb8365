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
    """A writer into the stream: `embed`, a head (`L0H5`) or an MLP (`mlp0`).

    `order` places it in the forward: `(layer, 0)` for a head, `(layer, 1)` for an MLP,
    `(-1, 1)` for the embedding; a receiver reads every sender before its own `reads`.
    """

    label: str
    kind: str
    layer: int
    head: int | None
    order: tuple[int, int]


@dataclasses.dataclass(frozen=True)
class Receiver:
    """A reader of the stream: a head's q/k/v input, an MLP's input, or the logits.

    `head` is the query head of a `q` receiver and the key/value head of a `k` or `v` one
    (the same index without grouping); `hook` is the hook point where its input passes in
    a model with `use_split_qkv_input` and `use_hook_mlp_in` (`analysis.discovery` runs
    such a copy, sharing the weights); `site` the stream it reads, before its norm;
    `reads` the order bound: it reads the senders whose `order` is below it.
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
        cfg.require_attention("the edge graph of circuit discovery (its senders are heads)")
        cfg.require_one_attention_shape("the edge graph of circuit discovery", key_value=True)
        senders = _senders(cfg.n_layers, cfg.n_heads, cfg.has_mlp)
        receivers = _receivers(
            cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.has_mlp, cfg.parallel_attn_mlp
        )
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


def _senders(n_layers: int, n_heads: int, has_mlp: bool) -> tuple[Sender, ...]:
    senders = [Sender("embed", "embed", -1, None, (-1, 1))]
    for layer in range(n_layers):
        senders += [
            Sender(head_label(layer, h), "head", layer, h, (layer, 0)) for h in range(n_heads)
        ]
        if has_mlp:
            senders.append(Sender(_mlp_label(layer), "mlp", layer, None, (layer, 1)))
    return tuple(senders)


def _receivers(
    n_layers: int, n_heads: int, n_kv_heads: int, has_mlp: bool, parallel: bool
) -> tuple[Receiver, ...]:
    grouped = n_kv_heads != n_heads
    receivers = []
    for layer in range(n_layers):
        reads = (layer, 0)  # resid_pre: the blocks before this one
        block = f"blocks.{layer}"
        for h in range(n_heads):
            hook = f"{block}.hook_q_input"
            receivers.append(
                Receiver(f"{head_label(layer, h)}.q", "q", layer, h, hook, "resid_pre", reads)
            )
        for kind in ("k", "v"):
            for g in range(n_kv_heads):
                name = f"L{layer}KV{g}" if grouped else head_label(layer, g)
                hook = f"{block}.hook_{kind}_input"
                receivers.append(
                    Receiver(f"{name}.{kind}", kind, layer, g, hook, "resid_pre", reads)
                )
        if has_mlp:
            site, mlp_reads = ("resid_pre", reads) if parallel else ("resid_mid", (layer, 1))
            receivers.append(
                Receiver(
                    _mlp_label(layer), "mlp", layer, None, f"{block}.hook_mlp_in", site, mlp_reads
                )
            )
    last = f"blocks.{n_layers - 1}.hook_resid_post"
    receivers.append(
        Receiver("logits", "logits", n_layers, None, last, "resid_post", (n_layers, 0))
    )
    return tuple(receivers)
