"""Circuits (sets of edges) and how much of the behaviour each recovers alone.

A circuit's *faithfulness* (Hanna, Pezzelle and Belinkov 2024; Conmy et al. 2023) is the
share of the clean-versus-ablated gap that the circuit recovers when every edge outside
it is ablated (`analysis.discovery._circuit_run`):

    faithfulness(C) = (m(C) - m(empty)) / (m(full) - m(empty))

`m(full)` is the clean run's metric (no edge ablated), `m(empty)` the metric with every
edge ablated: the corrupted run's when ablating by patching (exactly, on every block
shape), the mean-ablated model's with `ablation="mean"` (each ablated edge carries its
sender's term averaged over the corrupted prompts, position by position). 1: the circuit
alone does what the model does; 0: no better than nothing.

A faithfulness curve takes the `k` edges of largest |score| for each `k` of a list of
sizes, beside random circuits of the same sizes (uniform draws of `k` edges, seeded): a
circuit chosen by its scores should sit well above the random ones' mean.

More in `docs/guide/discovery.md`.
"""

import dataclasses
from collections.abc import Iterator, Sequence

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from analysis.discovery._circuit_run import circuit_metrics, prepare
from analysis.discovery.computational_graph import Graph
from analysis.discovery.scores import EdgeScores
from analysis.patching.engine import Metric
from analysis.tables import Table
from hookedattn.core.model import HookedTransformer


@dataclasses.dataclass(frozen=True, repr=False)
class Circuit:
    """A set of edges of one graph, with the scores it was chosen by (if any).

    `Circuit.from_labels(graph, ["L0H5 -> L1H2.k", ...])`, `Circuit.top(scores, k)` (the
    `k` edges of largest |score|), or what `acdc` returns. Iterating gives the edges'
    labels in the graph's order; `in` takes a label.
    """

    graph: Graph
    edges: frozenset[int]
    scores: EdgeScores | None = None

    def __post_init__(self) -> None:
        assert all(0 <= e < len(self.graph) for e in self.edges)
        assert self.scores is None or self.scores.graph == self.graph

    @classmethod
    def from_labels(
        cls, graph: Graph, labels: Sequence[str], scores: EdgeScores | None = None
    ) -> "Circuit":
        """The circuit of these edges (labels as `graph.labels` spells them)."""
        mask = graph.edge_mask(labels)
        return cls(graph, frozenset(torch.nonzero(mask)[:, 0].tolist()), scores)

    @classmethod
    def top(cls, scores: EdgeScores, k: int) -> "Circuit":
        """The `k` edges of largest |score| (ties to the earlier edge in the graph)."""
        if not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= len(scores):
            raise ValueError(f"k must be an int in 0..{len(scores)} (edges), got {k!r}")
        return cls(scores.graph, frozenset(scores.order()[:k]), scores)

    @property
    def labels(self) -> tuple[str, ...]:
        """The edges' labels, in the graph's order."""
        return tuple(self.graph.edges[i].label for i in sorted(self.edges))

    @property
    def mask(self) -> Bool[Tensor, " edge"]:
        """True at the circuit's edges."""
        mask = torch.zeros(len(self.graph), dtype=torch.bool)
        mask[list(self.edges)] = True
        return mask

    def nodes(self) -> tuple[str, ...]:
        """The senders and receivers the edges join, in the graph's order."""
        edges = [self.graph.edges[i] for i in sorted(self.edges)]
        senders = sorted({e.sender for e in edges})
        receivers = sorted({e.receiver for e in edges})
        return tuple(self.graph.senders[s].label for s in senders) + tuple(
            self.graph.receivers[r].label for r in receivers
        )

    def __len__(self) -> int:
        return len(self.edges)

    def __iter__(self) -> Iterator[str]:
        return iter(self.labels)

    def __contains__(self, label: object) -> bool:
        return isinstance(label, str) and label in self.labels

    def to_table(self) -> Table:
        """The edges, by decreasing |score| when the circuit has scores."""
        if self.scores is None:
            return Table(("edge",), tuple((label,) for label in self.labels), repr(self))
        order = [i for i in self.scores.order() if i in self.edges]
        rows = tuple((self.graph.edges[i].label, float(self.scores.scores[i])) for i in order)
        return Table(("edge", "score"), rows, repr(self))

    def __repr__(self) -> str:
        by = "" if self.scores is None else f", chosen by {self.scores.method}"
        return f"Circuit({self.graph.model_name}: {len(self)} of {len(self.graph)} edges{by})"


@dataclasses.dataclass(frozen=True)
class Faithfulness:
    """A circuit's metric with everything outside it ablated, against both extremes.

    `value` is `(circuit - empty) / (clean - empty)` of the means over prompts (module
    docstring); `circuit`, `clean`, `empty` and `corrupted` are per prompt.
    """

    value: float
    n_edges: int
    ablation: str
    circuit: Float[Tensor, " batch"]
    clean: Float[Tensor, " batch"]
    empty: Float[Tensor, " batch"]
    corrupted: Float[Tensor, " batch"]


def _fraction(
    values: Float[Tensor, ""], clean: Float[Tensor, " batch"], empty: Float[Tensor, " batch"]
) -> Float[Tensor, ""]:
    return (values - empty.mean()) / (clean.mean() - empty.mean())


def faithfulness(
    model: HookedTransformer,
    circuit: Circuit,
    *,
    # [batch pos] token ids, loosely annotated so that bad input gets our own message.
    clean_tokens: object,
    corrupted_tokens: object,
    metric: Metric,
    ablation: str = "patch",
    memory_budget: int | None = None,
) -> Faithfulness:
    """How much of the clean-versus-ablated gap `circuit` recovers alone (module docstring).

    `ablation`: `"patch"` (an edge outside the circuit carries the corrupted run's term)
    or `"mean"` (its mean over the corrupted prompts).
    """
    runs = prepare(model, clean_tokens, corrupted_tokens, metric, ablation)
    _check_graph(runs.graph, circuit.graph)
    ablated = torch.stack([~circuit.mask, torch.ones(len(runs.graph), dtype=torch.bool)])
    values = circuit_metrics(runs, ablated, memory_budget)
    value = float(_fraction(values[0].mean(), runs.clean, values[1]))
    return Faithfulness(
        value, len(circuit), ablation, values[0], runs.clean, values[1], runs.corrupted
    )


def _check_graph(graph: Graph, other: Graph) -> None:
    if graph != other:
        raise ValueError(f"the circuit is of {other!r}, but the model's graph is {graph!r}")


@dataclasses.dataclass(frozen=True)
class FaithfulnessCurve:
    """Faithfulness of the top-`k` circuits of one scoring, and of random ones, by size.

    `faithfulness[i]` is the circuit of the `sizes[i]` edges of largest |score|;
    `random[i, j]` the j-th random circuit of that size, summarised by `random_mean` and
    `random_std` (over the draws). `clean` and `empty` are the mean metrics of the full
    and the empty circuit.
    """

    method: str
    ablation: str
    sizes: tuple[int, ...]
    faithfulness: Float[Tensor, " size"]
    random: Float[Tensor, "size draw"]
    clean: float
    empty: float

    @property
    def random_mean(self) -> Float[Tensor, " size"]:
        """The random circuits' mean faithfulness at each size."""
        return self.random.mean(-1)

    @property
    def random_std(self) -> Float[Tensor, " size"]:
        """Their standard deviation at each size (0 for one draw)."""
        return (
            self.random.std(-1) if self.random.shape[-1] > 1 else torch.zeros_like(self.random_mean)
        )

    def smallest(self, at_least: float) -> int | None:
        """The fewest edges whose top circuit reaches faithfulness `at_least` (None if none)."""
        reached = [
            k for k, f in zip(self.sizes, self.faithfulness.tolist(), strict=True) if f >= at_least
        ]
        return min(reached) if reached else None

    def to_table(self) -> Table:
        """One row per size: the top circuit's faithfulness and the random ones'."""
        rows = tuple(
            (k, float(f), float(m), float(s))
            for k, f, m, s in zip(
                self.sizes, self.faithfulness, self.random_mean, self.random_std, strict=True
            )
        )
        title = (
            f"faithfulness of the top-k edges by {self.method} ({self.ablation} ablation), "
            f"{self.random.shape[-1]} random circuits per size"
        )
        return Table(("edges", "top-k", "random mean", "random std"), rows, title)

    def __repr__(self) -> str:
        return repr(self.to_table())


def _default_sizes(n_edges: int) -> tuple[int, ...]:
    """0, 1, 2, 4, ... doubling up to `n_edges`, which ends the list."""
    sizes, k = [0], 1
    while k < n_edges:
        sizes.append(k)
        k *= 2
    return (*sizes, n_edges)


def faithfulness_curve(
    model: HookedTransformer,
    scores: EdgeScores,
    *,
    # [batch pos] token ids, loosely annotated so that bad input gets our own message.
    clean_tokens: object,
    corrupted_tokens: object,
    metric: Metric,
    sizes: Sequence[int] | None = None,
    n_random: int = 8,
    seed: int = 0,
    ablation: str = "patch",
    memory_budget: int | None = None,
) -> FaithfulnessCurve:
    """Faithfulness of the top-`k` edges of `scores` for each `k` in `sizes` (default
    `_default_sizes`), beside `n_random` random circuits of each size (module docstring).
    Every circuit runs in the same batched circuit forwards."""
    runs = prepare(model, clean_tokens, corrupted_tokens, metric, ablation)
    _check_graph(runs.graph, scores.graph)
    n = len(runs.graph)
    sizes = tuple(_default_sizes(n) if sizes is None else sizes)
    if not sizes or any(
        not isinstance(k, int) or isinstance(k, bool) or not 0 <= k <= n for k in sizes
    ):
        raise ValueError(f"sizes must be a non-empty list of ints in 0..{n}, got {sizes!r}")
    if not isinstance(n_random, int) or isinstance(n_random, bool) or n_random < 1:
        raise ValueError(f"n_random must be an int >= 1, got {n_random!r}")
    generator = torch.Generator().manual_seed(seed)
    kept = [Circuit.top(scores, k).mask for k in sizes]
    for k in sizes:
        for _ in range(n_random):
            chosen = torch.randperm(n, generator=generator)[:k]
            kept.append(torch.zeros(n, dtype=torch.bool).index_fill_(0, chosen, True))
    ablated = ~torch.stack([*kept, torch.zeros(n, dtype=torch.bool)])
    values = circuit_metrics(runs, ablated, memory_budget).mean(-1)
    empty = float(values[-1])
    fractions = (values[:-1] - empty) / (float(runs.clean.mean()) - empty)
    top, random = fractions[: len(sizes)], fractions[len(sizes) :].reshape(len(sizes), -1)
    method = (
        scores.method if scores.ig_steps is None else f"{scores.method} ({scores.ig_steps} steps)"
    )
    return FaithfulnessCurve(method, ablation, sizes, top, random, float(runs.clean.mean()), empty)
