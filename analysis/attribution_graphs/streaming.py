"""Attribution graphs pruned while they are computed, in chunks under a memory budget.

A dense graph (`attribution_graph`) is `[node node]`, and every position of the prompt
brings its own active features, error nodes and token: the matrix grows as the square of
the prompt's length. `pruned_attribution_graph` computes the same rows (`_rows`), a chunk
of targets at a time, and keeps of them only what `prune_graph` needs:

1. Influence, one pass over every row. The logits come first, then the features layer by
   layer from the last: a node is read only by features of later layers and by the logits,
   so when its own row comes its influence is complete, and the row passes it on,
   `influence[s] += (w[t] + influence[t]) · Â[t, s]` (`Â` and `w` as in `pruning`). This is
   `w @ (Â + Â² + ...)` summed layer by layer instead of path length by path length, and
   needs one vector `[node]` besides the chunk.
2. The nodes holding `node_threshold` of the influence are kept (tokens and logits always),
   as `prune_graph` keeps them; with `max_feature_nodes`, at most that many features, the
   most influential.
3. Edges, a second pass over the kept features' rows only: each row is computed again and
   stored on the kept nodes' columns, `[row kept]`. Every other row of the pruned dense
   graph is zero, so edge pruning and the dropping of dangling nodes run as `prune_graph`
   runs them, on this block.

What is held: one chunk's rows and sweep (the chunk is sized to `memory_budget`), the
influence `[node]`, and the kept block. The kept block is `[row kept]`, rows the kept
features and the logits, columns those plus every token and the kept error nodes: with
`max_feature_nodes` it grows linearly with the prompt; without, it grows with the square
of the number of kept features. The frozen forward (`_frozen`) keeps each layer's queries
and keys, not its attention pattern, and a sweep makes the pattern's rows again a block
at a time (`_patterns`), a block within an eighth of the budget (`PATTERN_SHARE`): nothing
held grows as the square of the prompt (the frozen forward of a 2-layer, 8-head model
added 37 MiB at 1,024 tokens and 90 at 4,096, against 143 and 2,167 with its patterns
kept; the whole streamed graph under a 64 MiB budget 62 and 114:
`docs/guide/transcoders.md`). Time: every row is computed once, and the kept features'
rows twice; each sweep reads the pattern of the prompt up to its targets, so
the time grows faster than the square of the prompt's length.

Exactness: a stored row is its dense row on the kept columns, and `rest[r]` sums its
edges from the nodes not kept, so `adjacency[r].sum() + rest[r] + bias[r]` is what target
`r` reads, as for the dense graph; the tests check the whole result against
`prune_graph(attribution_graph(...))` in float64 with budgets that force many chunks.
"""

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from analysis.attribution_graphs import _budget, _rows
from analysis.attribution_graphs.attribution_graph import _NodeOrder
from analysis.attribution_graphs.pruning import _check_thresholds, _threshold

# A block of attention pattern rows, made again where a sweep reads it (`_patterns`), takes
# at most this fraction of the budget, beside the chunk's share (`_plan`).
PATTERN_SHARE = 8


@dataclasses.dataclass(frozen=True, repr=False)
class PrunedAttributionGraph(_NodeOrder):
    """A prompt's attribution graph pruned while it was computed (module docstring).

    Nodes are numbered as in `AttributionGraph` (`features`, `logit_tokens` and the rest as
    there). `nodes: [kept]` are the node ids kept by influence, in order; `rows: [row]`
    the positions in `nodes` of the targets stored (the kept features, then the logits).
    `adjacency: [row kept]` holds the edges into those targets from the kept nodes, `rest`
    the sum of their edges from the other nodes, `bias` their frozen bias terms.
    `node_mask: [kept]` and `edge_mask: [row kept]` are what pruning kept in the end (after
    edge pruning and dropping dangling nodes); `influence` and `cumulative_influence`
    (`[node]`, every node) and the three fractions are `PrunedGraph`'s. `sweeps` counts the
    chunks swept, each of at most `targets_per_sweep` targets, sized to `memory_budget`
    (bytes).
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
    transcoders: str
    scan: str
    demeaned_logits: bool
    dropped_first_position: bool
    nodes: Int[Tensor, " kept"]
    rows: Int[Tensor, " row"]
    adjacency: Float[Tensor, "row kept"]
    rest: Float[Tensor, " row"]
    bias: Float[Tensor, " row"]
    node_mask: Bool[Tensor, " kept"]
    edge_mask: Bool[Tensor, "row kept"]
    influence: Float[Tensor, " node"]
    cumulative_influence: Float[Tensor, " node"]
    node_threshold: float
    edge_threshold: float
    max_feature_nodes: int | None
    fraction_explained: float
    edge_fraction_explained: float
    error_fraction: float
    sweeps: int
    targets_per_sweep: int
    memory_budget: int

    @property
    def n_edges(self) -> int:
        """Edges kept."""
        return int(self.edge_mask.sum())

    def row(self, node: int) -> int:
        """The row of `adjacency` that holds node `node`'s incoming edges; a `KeyError` when
        they are not stored (only the kept features' and the logits' are)."""
        match = (self.nodes[self.rows] == node).nonzero()
        if len(match) == 0:
            raise KeyError(
                f"the incoming edges of {self.label(node)} are not stored: only those of the "
                f"{len(self.rows)} kept features and target logits"
            )
        return int(match[0, 0])

    def kept_nodes(self) -> Int[Tensor, " node"]:
        """The node ids pruning kept in the end, in order."""
        return self.nodes[self.node_mask]

    def kept_features(self) -> list[int]:
        """The kept feature nodes, most influential first."""
        kept = self.kept_nodes()
        kept = kept[kept < self.n_features]
        return kept[self.influence[kept].argsort(descending=True)].tolist()

    def __repr__(self) -> str:
        return (
            f"PrunedAttributionGraph({self.prompt!r}: {int(self.node_mask.sum())} of "
            f"{self.n_nodes} nodes ({len(self.kept_features())} of {self.n_features} "
            f"features), {self.n_edges:,} edges; {self.fraction_explained:.1%} of the "
            f"influence kept, {self.error_fraction:.1%} of it through error nodes; "
            f"{self.sweeps} sweeps)"
        )


@torch.no_grad()
def pruned_attribution_graph(
    model: Any,
    transcoders: Any,
    prompt: Any,
    *,
    node_threshold: float = 0.8,
    edge_threshold: float = 0.98,
    max_feature_nodes: int | None = None,
    memory_budget: int | str | None = None,
    logits: int | Sequence[int] | None = None,
    top_k: int = 5,
    demean_logits: bool = False,
    drop_first_position: bool = False,
    scan: str | None = None,
    progress: bool = True,
) -> PrunedAttributionGraph:
    """`prune_graph(attribution_graph(model, transcoders, prompt), node_threshold,
    edge_threshold)`, computed in chunks without the dense graph (module docstring).

    `memory_budget` bounds what a chunk holds (bytes, a text such as `"2GiB"`, or None for
    half the memory available now); `max_feature_nodes` caps the features kept (None: as
    many as `node_threshold` keeps, which makes the result `prune_graph`'s). `logits`,
    `top_k`, `demean_logits`, `drop_first_position` and `scan` are `attribution_graph`'s.
    A `tqdm` bar counts the sweeps unless `progress` is False.
    """
    _check_thresholds(node_threshold, edge_threshold)
    if max_feature_nodes is not None and (
        isinstance(max_feature_nodes, bool)
        or not isinstance(max_feature_nodes, int)
        or max_feature_nodes < 1
    ):
        raise ValueError(
            f"max_feature_nodes must be a positive int or None, got {max_feature_nodes!r}"
        )
    budget = _budget.memory_budget(memory_budget, next(model.parameters()).device)
    p = _rows.prepare(model, transcoders, prompt, logits, top_k, demean_logits,
                      drop_first_position, pattern_bytes=budget // PATTERN_SHARE)  # fmt: skip
    per_sweep, gather = _plan(p, budget)
    logit_chunks = p.targets.split(per_sweep)
    feature_chunks = [
        chunk
        for layer in reversed(range(p.g.f.n_layers))
        for chunk in (p.g.features[:, 0] == layer).nonzero().flatten().split(per_sweep)
        if len(chunk)
    ]
    bar = tqdm(total=len(logit_chunks) + len(feature_chunks), desc="attribution graph",
               unit="sweep", disable=not progress)  # fmt: skip
    with bar:
        influence, logit_rows = _influence(p, logit_chunks, feature_chunks, gather, bar)
        node_mask = _kept_by_influence(p, influence, node_threshold, max_feature_nodes)
        block = _kept_rows(p, node_mask, logit_rows, per_sweep, gather, bar)
    return PrunedAttributionGraph(
        **_rows.header(model, prompt, p, scan), nodes=block.nodes, rows=block.rows,
        adjacency=block.adjacency, rest=block.rest, bias=block.bias,
        **_pruned(p, block, influence, edge_threshold),
        node_threshold=float(node_threshold), edge_threshold=float(edge_threshold),
        max_feature_nodes=max_feature_nodes, targets_per_sweep=per_sweep,
        sweeps=len(logit_chunks) + len(feature_chunks) + block.sweeps,
        memory_budget=budget,
    )  # fmt: skip


def _plan(p: _rows.Prepared, budget: int) -> tuple[int, int]:
    """How many targets a sweep takes, and how many gathered gradient elements a chunk
    holds at once, for a chunk to stay within `budget` bytes: half to the rows and the
    sweep, half to the gathering. An estimate of the largest tensors a target needs (its
    row three times over, the sweep's gradients at each layer, the attention's per-head
    gradients), not a count of every allocation."""
    f = p.g.f
    n_pos, d_model = f.embed.shape
    per_head = max(a.W_O.shape[0] * a.W_O.shape[1] for a in f.attn)  # head × d_head
    elements = 3 * p.n_nodes + (2 * f.n_layers + 4) * n_pos * d_model + 3 * n_pos * per_head
    per_target = elements * f.embed.element_size()
    half = budget // 2
    if per_target > half:
        raise ValueError(
            f"memory_budget of {budget:,} bytes is too small for this prompt: one target "
            f"takes about {per_target:,} bytes and the budget is split in two; give at "
            f"least {2 * per_target:,}"
        )
    return half // per_target, max(d_model, half // f.embed.element_size())


def _influence(
    p: _rows.Prepared,
    logit_chunks: Sequence[Tensor],
    feature_chunks: Sequence[Tensor],
    gather: int,
    bar: Any,
) -> tuple[Float[Tensor, " node"], list[tuple[Tensor, Tensor]]]:
    """Every node's influence on the target logits (module docstring, 1), and the logits'
    rows with their bias (kept for the second pass: a few rows)."""
    g, n_nodes = p.g, p.n_nodes
    first_logit = g.n_nodes_before_logits
    weights = g.f.embed.new_zeros(n_nodes)
    weights[first_logit:] = p.probabilities[p.targets]
    influence = torch.zeros_like(weights)
    logit_rows, start = [], first_logit
    for chosen in logit_chunks:
        rows, bias = _rows.logit_rows(g, chosen, n_nodes, gather)
        ids = torch.arange(start, start + len(chosen), device=weights.device)
        _pass_on(influence, weights, ids, rows)
        logit_rows.append((rows, bias))
        start += len(chosen)
        bar.update()
    for chunk in feature_chunks:
        rows, _ = _rows.feature_rows(g, chunk, n_nodes, gather)
        _pass_on(influence, weights, chunk, rows)
        bar.update()
    return influence, logit_rows


def _pass_on(
    influence: Float[Tensor, " node"],
    weights: Float[Tensor, " node"],
    targets: Int[Tensor, " target"],
    rows: Float[Tensor, "target node"],
) -> None:
    """Add what the targets' influence (complete: module docstring) passes to their
    sources through the normalised rows, `(w[t] + influence[t]) · |A[t, s]| / Σ|A[t]|`."""
    absolute = rows.abs()
    share = (weights[targets] + influence[targets]) / absolute.sum(-1).clamp(min=1e-30)
    influence += share @ absolute


def _kept_by_influence(
    p: _rows.Prepared, influence: Tensor, node_threshold: float, max_feature_nodes: int | None
) -> Bool[Tensor, " node"]:
    """The nodes `prune_graph` keeps by influence (tokens and logits always), and of the
    features at most `max_feature_nodes`, the most influential."""
    first_logit = p.g.n_nodes_before_logits
    first_token = first_logit - len(p.tokens)
    kept = influence >= _threshold(influence[:first_logit], node_threshold)
    kept[first_token:] = True
    n_f = len(p.g.features)
    features = kept[:n_f].nonzero().flatten()
    if max_feature_nodes is not None and len(features) > max_feature_nodes:
        order = influence[features].argsort(descending=True, stable=True)
        kept[features[order[max_feature_nodes:]]] = False
    return kept


@dataclasses.dataclass(frozen=True)
class _Block:
    """The rows of the kept targets on the kept nodes' columns (`PrunedAttributionGraph`)."""

    nodes: Int[Tensor, " kept"]
    rows: Int[Tensor, " row"]
    adjacency: Float[Tensor, "row kept"]
    rest: Float[Tensor, " row"]
    bias: Float[Tensor, " row"]
    sweeps: int  # of the second pass


def _kept_rows(
    p: _rows.Prepared,
    kept: Bool[Tensor, " node"],
    logit_rows: list[tuple[Tensor, Tensor]],
    per_sweep: int,
    gather: int,
    bar: Any,
) -> _Block:
    """The second pass (module docstring, 3): the kept features' rows again, then the
    logits' from the first pass, each stored on the kept columns."""
    g, n_nodes = p.g, p.n_nodes
    nodes = kept.nonzero().flatten()
    features = nodes[nodes < len(g.features)]
    targets = torch.cat([features, nodes[nodes >= g.n_nodes_before_logits]])
    adjacency = g.f.embed.new_zeros(len(targets), len(nodes))
    rest, bias = g.f.embed.new_zeros(len(targets)), g.f.embed.new_zeros(len(targets))
    chunks = [
        chunk
        for layer in range(g.f.n_layers)
        for chunk in features[g.features[features, 0] == layer].split(per_sweep)
        if len(chunk)
    ]
    bar.total += len(chunks)
    bar.refresh()
    start = 0
    for rows, row_bias in _stream(g, chunks, n_nodes, gather, bar, logit_rows):
        size = len(rows)
        adjacency[start : start + size] = rows[:, nodes]
        rest[start : start + size] = rows.masked_fill(kept, 0).sum(-1)
        bias[start : start + size] = row_bias
        start += size
    return _Block(nodes, torch.searchsorted(nodes, targets), adjacency, rest, bias, len(chunks))


def _stream(
    g: _rows.Context,
    chunks: Sequence[Tensor],
    n_nodes: int,
    gather: int,
    bar: Any,
    logit_rows: list[tuple[Tensor, Tensor]],
) -> Iterator[tuple[Tensor, Tensor]]:
    """The feature chunks' rows, one chunk at a time, then the logits' rows."""
    for chunk in chunks:
        yield _rows.feature_rows(g, chunk, n_nodes, gather)
        bar.update()
    yield from logit_rows


def _pruned(
    p: _rows.Prepared, block: _Block, influence: Float[Tensor, " node"], edge_threshold: float
) -> dict[str, Any]:
    """Edge pruning and the dropping of dangling nodes on the kept block, and what the
    pruned graph explains: `prune_graph`'s steps, on the rows that can be nonzero."""
    nodes, rows, A = block.nodes, block.rows, block.adjacency
    n_f, first_logit = len(p.g.features), p.g.n_nodes_before_logits
    first_token = first_logit - len(p.tokens)
    weights = torch.zeros_like(influence)
    weights[first_logit:] = p.probabilities[p.targets]
    weights = weights[nodes]
    absolute = A.abs()
    kept_hat = absolute / absolute.sum(-1, keepdim=True).clamp(min=1e-30)
    kept_influence = _influence_in_block(kept_hat, rows, weights, p.g.f.n_layers + 2) + weights
    edge_scores = kept_hat * kept_influence[rows][:, None]
    edge_mask = (edge_scores >= _threshold(edge_scores, edge_threshold)) & (A != 0)
    node_mask = _drop_dangling(nodes, rows, edge_mask, n_f, first_token)
    final = torch.zeros_like(influence, dtype=torch.bool)
    final[nodes[node_mask]] = True
    sorted_scores, order = influence.sort(descending=True)
    cumulative = torch.empty_like(influence)
    cumulative[order] = sorted_scores.cumsum(0) / sorted_scores.sum().clamp(min=1e-30)
    non_logit = influence[:first_logit]
    errors = influence[n_f:first_token].sum()
    return dict(
        node_mask=node_mask, edge_mask=edge_mask, influence=influence,
        cumulative_influence=cumulative,
        fraction_explained=float(non_logit[final[:first_logit]].sum()
                                 / non_logit.sum().clamp(min=1e-30)),
        edge_fraction_explained=float(edge_scores[edge_mask].sum()
                                      / edge_scores.sum().clamp(min=1e-30)),
        error_fraction=float(errors / influence[n_f:first_logit].sum().clamp(min=1e-30)),
    )  # fmt: skip


def _influence_in_block(
    A_hat: Float[Tensor, "row kept"],
    rows: Int[Tensor, " row"],
    weights: Float[Tensor, " kept"],
    max_steps: int,
) -> Float[Tensor, " kept"]:
    """`pruning.influence` on a graph whose only nonzero rows are `rows` of `A_hat`: a
    vector over the nodes steps through the rows it reaches."""
    current = weights[rows] @ A_hat
    total = current.clone()
    for _ in range(max_steps):
        current = current[rows] @ A_hat
        if not bool(current.any()):
            return total
        total = total + current
    raise AssertionError(f"paths longer than {max_steps} edges: the graph is not layered")


def _drop_dangling(
    nodes: Int[Tensor, " kept"],
    rows: Int[Tensor, " row"],
    edge_mask: Bool[Tensor, "row kept"],
    n_features: int,
    first_token: int,
) -> Bool[Tensor, " kept"]:
    """`pruning._drop_dangling` on the block: until nothing changes, drop feature and error
    nodes without an outgoing edge, and features without an incoming one, with their edges
    (`edge_mask` in place); returns which of `nodes` stay."""
    mask = torch.ones_like(nodes, dtype=torch.bool)
    sends = nodes < first_token  # features and error nodes must send an edge
    receives = nodes[rows] < n_features  # features must receive one
    while True:
        before = mask.clone()
        edge_mask &= mask[rows][:, None] & mask[None, :]
        mask &= ~sends | edge_mask.any(0)
        mask[rows] &= ~receives | edge_mask.any(1)
        if bool((mask == before).all()):
            edge_mask &= mask[rows][:, None] & mask[None, :]
            return mask
