"""Attribution graphs: one prediction explained through transcoder features, exactly.

    graph = attribution_graph(model, transcoders, "def f(x):\\n    return f(", top_k=3)
    graph.adjacency[t, s]          # the direct effect of node s on node t

The nodes, in order (circuit-tracer's): every active feature `(layer, pos, feature)`, one
error node per `(layer, pos)` (what the transcoder misses of that MLP output), one input
token per position, and the target logits at the last position. `adjacency[t, s]` is the
direct linear effect of source `s` on target `t` with the attention patterns, norm scales
and error terms frozen at this prompt's forward (`_frozen`): `s`'s write carried by the
frozen linear map to what `t` reads, a feature's pre-activation or a logit. No other node
is on the path (a feature reached through another has its own edge); attention and the
skip terms are part of the map, not nodes. The replacement model with error terms is the
model's own forward, and with those things frozen it is affine in what the nodes write:

    Σ_s adjacency[t, s] + bias[t] = pre-activation of t   (or the logit, before any soft cap)

to rounding, `bias[t]` the "frozen bias terms" on the way (norm biases, `b_V`, `b_O`,
`b_dec`, `b_enc` or `b_U`); the tests check it in float64 to 1e-10. An edge is linear in
its source's value (a feature's activation, a token's embedding, an error node's vector),
so `total_effects`, which follows a change through the active features downstream, is the
first-order change of each logit when a node is scaled by `1 + ε`. Pruning, export and
interventions: the package's other modules; the guide: `docs/guide/transcoders.md`.

Two conventions of circuit-tracer's `attribute` are options (`demean_logits`,
`drop_first_position`), off by default:

- circuit-tracer's logit targets are each logit less the mean logit (the unembedding
  column less the mean column, the direction that moves the softmax); ours are the logits
  the model returns. `demean_logits=True` makes the targets its, and the identity above
  holds with `logit - mean(logits)`.
- circuit-tracer prepends a BOS and leaves position 0 out: no features there, zero error
  vectors there. `drop_first_position=True` does the same; what those features and errors
  write is then a frozen constant, counted in `bias` (the identity holds).

They are off by default because the graph then accounts for the model's own output, every
position included: our prompts start with a BOS only where the model's tokenizer adds one,
so position 0 may be a word of the prompt, and a dropped node's effect would otherwise go
unseen.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from analysis.attribution_graphs import _budget, _rows


class _NodeOrder:
    """The node order of a prompt's graph (module docstring), for the classes that hold one:
    they have `tokens`, `token_strings`, `n_layers`, `features`, `logit_tokens` and
    `logit_strings`."""

    tokens: Int[Tensor, " pos"]
    token_strings: tuple[str, ...]
    n_layers: int
    features: Int[Tensor, "feature 3"]
    logit_tokens: Int[Tensor, " logit"]
    logit_strings: tuple[str, ...]

    # ------------------------------------------------------------------ the node order
    @property
    def n_pos(self) -> int:
        """Positions in the prompt."""
        return len(self.tokens)

    @property
    def n_features(self) -> int:
        """Active feature nodes."""
        return len(self.features)

    @property
    def n_nodes(self) -> int:
        """All nodes: features, error nodes, tokens, logits."""
        return self.n_features + (self.n_layers + 1) * self.n_pos + len(self.logit_tokens)

    def error_node(self, layer: int, pos: int) -> int:
        """The index of the error node of layer `layer` at position `pos`."""
        return self.n_features + layer * self.n_pos + pos

    def token_node(self, pos: int) -> int:
        """The index of the input token at position `pos`."""
        return self.n_features + self.n_layers * self.n_pos + pos

    def logit_node(self, i: int) -> int:
        """The index of the `i`-th target logit (`logit_tokens[i]`)."""
        return self.n_features + (self.n_layers + 1) * self.n_pos + i

    def feature_node(self, layer: int, pos: int, feature: int) -> int:
        """The index of the active feature `feature` of layer `layer` at position `pos`; a
        `KeyError` when it is not active there."""
        wanted = torch.tensor([layer, pos, feature], device=self.features.device)
        match = (self.features == wanted).all(-1).nonzero()
        if len(match) == 0:
            raise KeyError(f"feature {feature} of layer {layer} is not active at position {pos}")
        return int(match[0, 0])

    def label(self, node: int) -> str:
        """A short name for a node: `L1.F42@7`, `L0.error@3`, `tok 'a'@2`, `logit 'b'`."""
        if node < self.n_features:
            layer, pos, feature = self.features[node].tolist()
            return f"L{layer}.F{feature}@{pos}"
        node -= self.n_features
        if node < self.n_layers * self.n_pos:
            return f"L{node // self.n_pos}.error@{node % self.n_pos}"
        node -= self.n_layers * self.n_pos
        if node < self.n_pos:
            return f"tok {self.token_strings[node]!r}@{node}"
        i = node - self.n_pos
        return f"logit {self.logit_strings[i]!r}"


@dataclasses.dataclass(frozen=True, repr=False)
class AttributionGraph(_NodeOrder):
    """The graph of one prompt's prediction (module docstring).

    `features: [feature 3]` holds `(layer, pos, index)` of each active feature, in node
    order, `activations` their values; `logit_tokens` the target tokens (at the last
    position), `logit_strings` them as text and `logit_probabilities` their probabilities.
    `adjacency: [node node]` is targets by sources; `bias: [node]` the frozen bias terms of
    each target (zero for nodes that are only sources). `backward_batches` counts the
    transposed sweeps run. `scan` names the transcoders in the graph JSON; `demeaned_logits`
    and `dropped_first_position` say which of circuit-tracer's conventions it follows
    (module docstring).
    """

    prompt: str
    tokens: Int[Tensor, " pos"]
    token_strings: tuple[str, ...]
    n_layers: int
    features: Int[Tensor, "feature 3"]
    activations: Float[Tensor, " feature"]
    logit_tokens: Int[Tensor, " logit"]
    logit_strings: tuple[str, ...]
    logit_probabilities: Float[Tensor, " logit"]
    adjacency: Float[Tensor, "node node"]
    bias: Float[Tensor, " node"]
    backward_batches: int
    transcoders: str
    scan: str = ""
    demeaned_logits: bool = False
    dropped_first_position: bool = False

    # ------------------------------------------------------------------ what it predicts
    def total_effects(self) -> Float[Tensor, "logit node"]:
        """`[i, s]`: the first-order change of target logit `i` per unit `ε` when node `s`
        is scaled by `1 + ε`, through every path of the graph (each active feature passing
        a change of its pre-activation on to its activation one to one)."""
        A, n_f = self.adjacency, self.n_features
        rows = [self.logit_node(i) for i in range(len(self.logit_tokens))]
        current = A[rows]
        total = current.clone()
        for _ in range(self.n_layers):
            current = (current[:, :n_f] / self.activations) @ A[:n_f]
            total = total + current
        return total

    def __repr__(self) -> str:
        logits = ", ".join(repr(s) for s in self.logit_strings)
        return (
            f"AttributionGraph({self.prompt!r}: {self.n_features} features, "
            f"{self.n_layers * self.n_pos} error nodes, {self.n_pos} tokens, logits {logits}; "
            f"{int((self.adjacency != 0).sum()):,} edges)"
        )


@torch.no_grad()
def attribution_graph(
    model: Any,
    transcoders: Any,
    prompt: Any,
    *,
    logits: int | Sequence[int] | None = None,
    top_k: int = 5,
    batch_size: int = 64,
    demean_logits: bool = False,
    drop_first_position: bool = False,
    scan: str | None = None,
    max_bytes: int | None = None,
) -> AttributionGraph:
    """The attribution graph of `model`'s prediction after `prompt` (text, or token ids
    `[pos]`), with its MLPs replaced by `transcoders` (a list of per-layer ones, or a
    `CrossLayerTranscoder`; every layer replaced).

    The target logits are `logits` (token ids) or the `top_k` most probable next tokens.
    Targets are swept down `batch_size` at a time (`backward_batches` counts the sweeps).
    `demean_logits` and `drop_first_position` take circuit-tracer's conventions (module
    docstring; both off by default, as said there). `scan` is circuit-tracer's name for the
    transcoders (Neuronpedia's, e.g. `"gemma-2-2b"`), which the graph JSON carries; by
    default `{model_name}/{kind}-{d_sae}`.

    The graph is a dense `[node node]` matrix: one refused up front, with its size, when it
    would take more than `max_bytes` (default: half the memory available on its device
    now). Its memory grows with the square of the prompt's length; `pruned_attribution_graph`
    gives its pruned graph in memory that grows linearly.
    """
    p = _rows.prepare(model, transcoders, prompt, logits, top_k, demean_logits, drop_first_position)
    _check_size(p.n_nodes, p.g.f.embed, max_bytes)
    adjacency, bias = p.g.f.embed.new_zeros(p.n_nodes, p.n_nodes), p.g.f.embed.new_zeros(p.n_nodes)
    batches = _fill(p.g, adjacency, bias, p.targets, batch_size)
    return AttributionGraph(
        **_rows.header(model, prompt, p, scan),
        adjacency=adjacency,
        bias=bias,
        backward_batches=batches,
    )


def _check_size(n_nodes: int, like: Tensor, max_bytes: int | None) -> None:
    """Refuse a graph whose adjacency would take more than `max_bytes` (default: half the
    free memory of `like`'s device, where it can be read)."""
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int)
                                  or max_bytes < 1):  # fmt: skip
        raise ValueError(f"max_bytes must be a positive int (bytes) or None, got {max_bytes!r}")
    free = _budget.free_memory(like.device)
    budget = (None if free is None else free // 2) if max_bytes is None else max_bytes
    needed = n_nodes * n_nodes * like.element_size()
    if budget is not None and needed > budget:
        source = "max_bytes" if max_bytes is not None else "half the free memory"
        raise ValueError(
            f"this attribution graph has {n_nodes:,} nodes: its adjacency [{n_nodes} "
            f"{n_nodes}] in {like.dtype} would take {needed / 2**30:.2f} GiB, more than "
            f"{budget / 2**30:.2f} GiB ({source}); use a shorter prompt, fewer active "
            f"features (transcoders with a higher threshold) or fewer target logits, or "
            f"pass a larger max_bytes, or compute the pruned graph in chunks without the "
            f"dense one (pruned_attribution_graph)"
        )


def _fill(
    g: _rows.Context,
    adjacency: Tensor,
    bias: Tensor,
    targets: Int[Tensor, " logit"],
    batch_size: int,
) -> int:
    """Every row of the graph: the feature targets layer by layer, then the logits,
    `batch_size` targets a sweep; returns how many sweeps."""
    batches, n_nodes = 0, len(adjacency)
    for layer in range(g.f.n_layers):
        for chunk in (g.features[:, 0] == layer).nonzero().flatten().split(batch_size):
            adjacency[chunk], bias[chunk] = _rows.feature_rows(g, chunk, n_nodes)
            batches += 1
    first_logit = g.n_nodes_before_logits
    logit_rows_ = torch.arange(first_logit, first_logit + len(targets), device=targets.device)
    for chosen, rows in zip(targets.split(batch_size), logit_rows_.split(batch_size), strict=True):
        adjacency[rows], bias[rows] = _rows.logit_rows(g, chosen, n_nodes)
        batches += 1
    return batches
