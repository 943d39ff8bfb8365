"""Forwards of the clean prompts with some edges ablated: what a circuit alone computes.

In a circuit forward every receiver reads, from each of its senders, the sender's term
*in this forward* if the edge is kept, and a reference term if it is ablated (the
corrupted run's, or that term's mean over the corrupted prompts):

    input_r = current_input_r + sum over ablated s -> r of (reference_s - current_s)

Unlike one edge patched alone, the senders' current terms are not the clean run's once an
earlier receiver has been changed, so they are read as the forward makes them (each
head's write from `hook_z`, through a norm after the attention at the divisor this
forward records; each MLP's `hook_mlp_out`, a hybrid's mixer's `hook_attn_out`) and the
receivers' inputs are edited in the same forward, per head on a model with a hook point
at each (`_terms.split_model`). Many circuits run together, stacked on the batch axis; a
pass starts at the first block where any of its circuits ablates an edge (the blocks
before are the clean run's).

More in `docs/guide/discovery.md`.
"""

import dataclasses
from collections.abc import Callable

import torch
from einops import einsum, rearrange
from jaxtyping import Bool, Float, Int
from torch import Tensor

from analysis.discovery._terms import Terms, sender_terms, split_model, term_hooks
from analysis.discovery.computational_graph import Graph
from analysis.head_results import head_writes
from analysis.patching.engine import (
    Metric,
    default_memory_budget,
    itemsize,
    metric_values,
    paired_tokens,
    row_floats,
    warn_if_tied,
)
from hookedattn.core.cache import ActivationCache
from hookedattn.core.model import HookedTransformer
from hookedattn.core.names import get_act_name, layer_of

ABLATIONS = ("patch", "mean")


@dataclasses.dataclass(frozen=True)
class CircuitRuns:
    """What every circuit forward of one prompt pair starts from."""

    split: HookedTransformer
    graph: Graph
    cache: ActivationCache  # the clean run: resid_pre of every block and the term hooks
    clean_terms: Terms
    reference: Terms  # what an ablated edge carries
    clean: Float[Tensor, " batch"]  # the metric of the clean and corrupted runs
    corrupted: Float[Tensor, " batch"]
    metric: Metric
    ablation: str
    hooks: dict[str, "HookEdges"]  # the edges into each receiver hook point


def prepare(
    model: HookedTransformer,
    clean_tokens: object,
    corrupted_tokens: object,
    metric: Metric,
    ablation: str,
) -> CircuitRuns:
    """The clean and corrupted runs, checked, and the reference terms of `ablation`:
    `"patch"` (the corrupted run's terms) or `"mean"` (their mean over the corrupted
    prompts, position by position)."""
    if ablation not in ABLATIONS:
        raise ValueError(f"ablation must be one of {ABLATIONS}, got {ablation!r}")
    graph = Graph.from_model(model)
    split = split_model(model)
    clean_tokens, corrupted_tokens = paired_tokens(split, clean_tokens, corrupted_tokens)
    names = term_hooks(split) + [get_act_name("resid_pre", i) for i in range(graph.n_layers)]
    with torch.no_grad():
        logits, cache = split.run_with_cache(clean_tokens, names_filter=names)
        corrupted_logits, corrupted = split.run_with_cache(corrupted_tokens, names_filter=names)
    clean_metric = metric_values(metric, logits).detach()
    corrupted_metric = metric_values(metric, corrupted_logits).detach()
    warn_if_tied(clean_metric, corrupted_metric, stacklevel=4)
    reference = sender_terms(split, corrupted, graph)
    if ablation == "mean":
        reference = reference.mean(1, keepdim=True).expand_as(reference)
    hooks = {
        hook: HookEdges.of(graph, hook) for hook in dict.fromkeys(r.hook for r in graph.receivers)
    }
    return CircuitRuns(
        split,
        graph,
        cache,
        sender_terms(split, cache, graph),
        reference,
        clean_metric,
        corrupted_metric,
        metric,
        ablation,
        hooks,
    )


def circuit_metrics(
    runs: CircuitRuns, ablated: Bool[Tensor, "variant edge"], memory_budget: int | None = None
) -> Float[Tensor, "variant batch"]:
    """The metric of each variant's circuit forward (`ablated[i]`: the edges variant i
    ablates), in passes within `memory_budget` bytes."""
    split, batch = runs.split, runs.clean.shape[0]
    budget = default_memory_budget(split) if memory_budget is None else memory_budget
    n_pos = runs.clean_terms.shape[2]
    per_variant = (
        batch
        * n_pos
        * itemsize(split.cfg)
        * (row_floats(split.cfg, n_pos) + 2 * len(runs.graph.senders) * split.cfg.d_model)
    )
    size = max(1, budget // per_variant)
    out = [_pass(runs, ablated[i : i + size]) for i in range(0, len(ablated), size)]
    return torch.cat(out) if out else runs.clean.new_zeros(0, batch)


def _start(graph: Graph, ablated: Bool[Tensor, "variant edge"]) -> int:
    """The first block any variant changes (a receiver of the logits is the last block)."""
    touched = ablated.any(0).tolist()
    layers = [
        graph.receivers[e.receiver].layer for e, t in zip(graph.edges, touched, strict=True) if t
    ]
    return min([graph.n_layers - 1, *layers])


def _pass(runs: CircuitRuns, ablated: Bool[Tensor, "variant edge"]) -> Float[Tensor, "v batch"]:
    """One forward of the variants `ablated`, stacked on the batch axis."""
    split, graph = runs.split, runs.graph
    n_variants = len(ablated)
    start = _start(graph, ablated)
    seen: dict[str, Tensor] = {}

    def keep(activation: Tensor, hook) -> None:
        seen[hook.name] = activation

    kept = [name for name in term_hooks(split) if _layer_of(name) >= start]
    hooks: list[tuple[str, Callable]] = [(name, keep) for name in kept]
    current = _Current(runs, seen, n_variants)
    for hook in dict.fromkeys(r.hook for r in graph.receivers):
        edit = _receiver_edit(runs, current, ablated, hook, start)
        if edit is not None:
            hooks.append((hook, edit))
    resid = runs.cache[get_act_name("resid_pre", start)]
    resid = rearrange(resid.expand(n_variants, *resid.shape), "v b p d -> (v b) p d")
    with torch.no_grad(), split.hooks(fwd_hooks=hooks):
        logits = split(resid.contiguous(), start_at_layer=start)
    logits = rearrange(logits, "(v b) p vocab -> v b p vocab", v=n_variants)
    # One call per variant: a metric may index its prompts (their answers) by batch row.
    return torch.stack([metric_values(runs.metric, logits[v]) for v in range(n_variants)])


def _layer_of(name: str) -> int:
    layer = layer_of(name)
    return -1 if layer is None else layer


# Where a sender that is one whole sublayer writes: an MLP, or a hybrid's mixer.
_WRITES = {"mlp": "mlp_out", "mixer": "attn_out"}


class _Current:
    """The senders' terms as the forward being run makes them (for senders in the pass's
    blocks; those before it wrote what they wrote in the clean run)."""

    def __init__(self, runs: CircuitRuns, seen: dict[str, Tensor], n_variants: int) -> None:
        self.runs, self.seen, self.n = runs, seen, n_variants
        self._heads: dict[int, Tensor] = {}
        self._shifts: dict[tuple[int, ...], Tensor] = {}

    def shift(self, senders: list[int]) -> Float[Tensor, "variant sender n"]:
        """`reference - current` of `senders` (the heads of one block, one MLP or one mixer), each
        flattened over (batch pos d_model); computed once a forward, as the q, k and v
        inputs of one block all read it."""
        key = tuple(senders)
        if key not in self._shifts:
            first = self.runs.graph.senders[senders[0]]
            if first.kind in _WRITES:
                written = self.seen[get_act_name(_WRITES[first.kind], first.layer)]
                now = rearrange(written, "(v b) p d -> v 1 b p d", v=self.n)
            else:
                heads = [self.runs.graph.senders[s].head for s in senders]
                now = self.heads(first.layer)[:, heads]
            shift = self.runs.reference[list(senders)] - now
            self._shifts[key] = rearrange(shift, "v s b p d -> v s (b p d)")
        return self._shifts[key]

    def heads(self, layer: int) -> Float[Tensor, "variant head batch pos d_model"]:
        """Every head's write in block `layer`, computed once a forward."""
        if layer not in self._heads:
            names = [n for n in self.seen if _layer_of(n) == layer and "mlp_out" not in n]
            cache = ActivationCache({n: self.seen[n] for n in names}, self.runs.graph.n_layers)
            writes = head_writes(self.runs.split, cache, layer)
            self._heads[layer] = rearrange(writes, "(v b) p head d -> v head b p d", v=self.n)
        return self._heads[layer]


@dataclasses.dataclass(frozen=True)
class HookEdges:
    """The edges into the receivers at one hook point: their indices, and each one's head
    (0 for an MLP's or the logits' input) and column among the senders those receivers
    read (the same for all of them)."""

    senders: tuple[int, ...]
    per_head: bool
    n_heads: int
    edges: Int[Tensor, " edge"]
    heads: Int[Tensor, " edge"]
    columns: Int[Tensor, " edge"]

    @classmethod
    def of(cls, graph: Graph, hook: str) -> "HookEdges":
        """The edges of `graph` into the receivers at `hook`."""
        at = [i for i, r in enumerate(graph.receivers) if r.hook == hook]
        senders = graph.senders_of(at[0])
        per_head = graph.receivers[at[0]].kind in ("q", "k", "v")
        column = {s: j for j, s in enumerate(senders)}
        edges = [i for i, e in enumerate(graph.edges) if e.receiver in at]
        heads = [graph.receivers[graph.edges[i].receiver].head if per_head else 0 for i in edges]
        columns = [column[graph.edges[i].sender] for i in edges]
        as_tensor = lambda x: torch.tensor(x, dtype=torch.long)
        return cls(
            senders,
            per_head,
            len(at) if per_head else 1,
            as_tensor(edges),
            as_tensor(heads),
            as_tensor(columns),
        )

    def weights(
        self, ablated: Bool[Tensor, "variant edge"], dtype: torch.dtype, device: torch.device
    ) -> Float[Tensor, "variant head sender"]:
        """1 where a variant ablates the edge from that sender into that head."""
        weights = torch.zeros(len(ablated), self.n_heads, len(self.senders), dtype=dtype)
        weights[:, self.heads, self.columns] = ablated[:, self.edges].to(dtype)
        return weights.to(device)


def _receiver_edit(
    runs: CircuitRuns,
    current: _Current,
    ablated: Bool[Tensor, "variant edge"],
    hook: str,
    start: int,
) -> Callable | None:
    """The hook that edits the inputs of the receivers at `hook` (None if no variant
    ablates an edge into them): `sum_s weight[v, s, head] (reference_s - current_s)`
    added, the senders before block `start` as one fixed product, the others grouped by
    the part of the forward that writes them."""
    graph, at = runs.graph, runs.hooks[hook]
    senders, per_head = list(at.senders), at.per_head
    weights = at.weights(ablated.cpu(), runs.reference.dtype, runs.reference.device)
    used = weights.flatten(0, 1).any(0).tolist()
    chosen = [j for j in range(len(senders)) if used[j]]
    if not chosen:
        return None
    fixed = [j for j in chosen if graph.senders[senders[j]].layer < start]
    groups: dict[tuple[int, str], list[int]] = {}
    for j in chosen:
        sender = graph.senders[senders[j]]
        if sender.layer >= start:
            groups.setdefault((sender.layer, sender.kind), []).append(j)

    def edit(activation: Tensor, hook) -> Tensor:
        v, n_heads = len(ablated), weights.shape[1]
        delta = activation.new_zeros(v, n_heads, activation.numel() // v // n_heads)
        if fixed:
            rows = [senders[j] for j in fixed]
            shift = rearrange(runs.reference[rows] - runs.clean_terms[rows], "s b p d -> s (b p d)")
            delta = delta + einsum(weights[:, :, fixed], shift, "v h s, s n -> v h n")
        for group in groups.values():
            shift = current.shift([senders[j] for j in group])
            delta = delta + einsum(weights[:, :, group], shift, "v h s, v s n -> v h n")
        _, n_pos, *_, d_model = activation.shape
        delta = rearrange(delta, "v h (b p d) -> v b p h d", p=n_pos, d=d_model)
        if not per_head:
            return activation + rearrange(delta, "v b p 1 d -> (v b) p d")
        by_variant = rearrange(activation, "(v b) p h d -> v b p h d", v=v)
        return rearrange(by_variant + delta, "v b p h d -> (v b) p h d")

    return edit
