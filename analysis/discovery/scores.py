"""What scoring every edge returns: `EdgeScores`, and how two scorings agree.

Every method gives each edge the change of the metric when that edge alone carries the
corrupted run's value of its sender and everything else is clean (noising): exactly
(`edge_patching`), to first order (`"eap"`), or integrated along the inputs (`"eap-ig"`).
The scores are in the metric's units, so the methods compare number for number
(`compare_edge_scores`: Spearman's rank correlation and the overlap of the top k).

More in `docs/guide/discovery.md`.
"""

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from analysis.discovery.computational_graph import Graph
from analysis.tables import Table
from hookedattn.viewer import html_table

METHODS = ("edge patching", "eap", "eap-ig", "acdc")
COLUMNS = ("edge", "sender", "receiver", "score", "normalised")


@dataclasses.dataclass(frozen=True, repr=False)
class EdgeScores:
    """The metric's change when each edge alone is patched, per prompt, with the baselines.

    `per_prompt[e, b]` is that change for edge `graph.edges[e]` on prompt b (its estimate,
    for the attribution methods); `scores` its mean over prompts. `clean` and `corrupted`
    are the unpatched metrics; `normalised` divides the scores by the gap
    `corrupted - clean`, so 1 is an edge that alone moves the metric all the way to the
    corrupted run's. `ig_steps` is the number of integration steps of `"eap-ig"`.
    For `"acdc"` a score is the change when the edge was removed from the circuit of its
    step (see `acdc`).
    """

    graph: Graph
    method: str
    per_prompt: Float[Tensor, "edge batch"]
    clean: Float[Tensor, " batch"]
    corrupted: Float[Tensor, " batch"]
    ig_steps: int | None = None

    def __post_init__(self) -> None:
        assert self.method in METHODS, self.method
        assert tuple(self.per_prompt.shape) == (len(self.graph), self.clean.shape[0])

    @property
    def labels(self) -> tuple[str, ...]:
        """Every edge's label, in the graph's order."""
        return self.graph.labels

    @property
    def scores(self) -> Float[Tensor, " edge"]:
        """Each edge's score: the change of the metric, averaged over prompts."""
        return self.per_prompt.mean(-1)

    @property
    def clean_baseline(self) -> float:
        """The clean metric, averaged over prompts."""
        return float(self.clean.mean())

    @property
    def corrupted_baseline(self) -> float:
        """The corrupted metric, averaged over prompts."""
        return float(self.corrupted.mean())

    @property
    def normalised(self) -> Float[Tensor, " edge"]:
        """The scores over `corrupted - clean`: 1 is an edge that alone does all of it."""
        return self.scores / (self.corrupted_baseline - self.clean_baseline)

    def __len__(self) -> int:
        return len(self.graph)

    def __getitem__(self, label: str) -> float:
        """The score of one edge, by label: `scores["L0H5 -> L1H2.k"]`."""
        return float(self.scores[self.graph.index(label)])

    def order(self, receiver: str | None = None) -> list[int]:
        """Edge indices by decreasing |score| (of the edges into `receiver`, if given)."""
        chosen = list(range(len(self.graph))) if receiver is None else self.graph.into(receiver)
        magnitude = self.scores.abs()
        return sorted(chosen, key=lambda i: (-float(magnitude[i]), i))

    def top(self, k: int = 10, *, receiver: str | None = None) -> Table:
        """The `k` edges of largest |score|, or of those into `receiver` (`"L1H2.k"`)."""
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        where = "" if receiver is None else f" into {receiver}"
        title = f"top {k} edges{where} by |score| ({self._what()})"
        return Table(COLUMNS, tuple(self._row(i) for i in self.order(receiver)[:k]), title)

    def to_table(self) -> Table:
        """Every edge, in the graph's order."""
        rows = tuple(self._row(i) for i in range(len(self.graph)))
        return Table(COLUMNS, rows, f"every edge ({self._what()})")

    def _row(self, i: int) -> tuple[object, ...]:
        edge = self.graph.edges[i]
        sender = self.graph.senders[edge.sender].label
        receiver = self.graph.receivers[edge.receiver].label
        return (edge.label, sender, receiver, float(self.scores[i]), float(self.normalised[i]))

    def _columns(self) -> dict[str, list[object]]:
        rows = self.to_table().rows
        return {name: [row[i] for row in rows] for i, name in enumerate(COLUMNS)}

    def to_dict(self) -> dict[str, Any]:
        """Plain data: the method, the baselines and one list per column (JSON-ready)."""
        columns = self._columns()
        return {
            "model": self.graph.model_name,
            "method": self.method,
            "ig_steps": self.ig_steps,
            "n_prompts": int(self.clean.shape[0]),
            "clean": _finite(self.clean_baseline),
            "corrupted": _finite(self.corrupted_baseline),
            "columns": {k: [_finite(v) for v in vs] for k, vs in columns.items()},
        }

    def to_json(self, path: str | Path | None = None) -> str:
        """`to_dict()` as JSON text (NaN as null), also written to `path` if given."""
        text = json.dumps(self.to_dict(), indent=1, allow_nan=False)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    def to_dataframe(self) -> Any:
        """Every edge as a `pandas.DataFrame` (pandas is optional: imported here only)."""
        try:
            import pandas
        except ImportError:
            raise ImportError(
                "to_dataframe needs pandas (pip install pandas); to_dict() and to_table() "
                "give the same columns without it"
            ) from None
        return pandas.DataFrame(self._columns())

    def _what(self) -> str:
        steps = f", {self.ig_steps} steps" if self.ig_steps is not None else ""
        return (
            f"{self.method}{steps}: clean {self.clean_baseline:.4g}, corrupted "
            f"{self.corrupted_baseline:.4g}"
        )

    def __repr__(self) -> str:
        top = "; ".join(f"{row[0]}: {row[3]:+.3g}" for row in self.top(3).rows)
        return f"EdgeScores({self.graph.model_name}, {len(self)} edges, {self._what()}; {top})"

    def _repr_html_(self) -> str:
        k = min(15, len(self))
        rows = [(row[0], row[3], row[4]) for row in self.top(k).rows]
        note = f"the {k} largest of {len(self)} edges; normalised: 1 = all of corrupted - clean"
        return html_table(("edge", "score", "normalised"), rows, self._what(), note, shade=True)


def _finite(value: object) -> object:
    return None if isinstance(value, float) and not math.isfinite(value) else value


@dataclasses.dataclass(frozen=True)
class EdgeAgreement:
    """How well one scoring of the edges ranks them as another (the reference) does.

    `spearman`: Spearman's rank correlation of the signed scores; `spearman_abs`: of
    their magnitudes (the ranking a circuit is cut from); `top_overlap`: the share of the
    reference's `k` edges of largest |score| among the other's `k`; `pearson`: the linear
    correlation of the scores. Ties share their mean rank.
    """

    method: str
    reference: str
    spearman: float
    spearman_abs: float
    pearson: float
    top_overlap: float
    k: int


def compare_edge_scores(approx: EdgeScores, exact: EdgeScores, k: int = 10) -> EdgeAgreement:
    """Agreement of `approx` with `exact` over every edge (see `EdgeAgreement`)."""
    if approx.graph != exact.graph:
        raise ValueError(
            f"cannot compare scores of different graphs: {approx.graph!r} and {exact.graph!r}"
        )
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= len(exact):
        raise ValueError(f"k must be an int in 1..{len(exact)}, got {k!r}")
    a, e = approx.scores.double(), exact.scores.double()
    overlap = len(set(approx.order()[:k]) & set(exact.order()[:k])) / k
    return EdgeAgreement(
        approx.method if approx.ig_steps is None else f"{approx.method}, {approx.ig_steps} steps",
        exact.method,
        _correlation(_ranks(a), _ranks(e)),
        _correlation(_ranks(a.abs()), _ranks(e.abs())),
        _correlation(a, e),
        overlap,
        k,
    )


def _ranks(x: Float[Tensor, " n"]) -> Float[Tensor, " n"]:
    """Ranks 0..n-1, ties given their mean rank."""
    order = x.argsort()
    ranks = torch.empty_like(x)
    ranks[order] = torch.arange(len(x), dtype=x.dtype)
    values, inverse = torch.unique(x, return_inverse=True)
    sums = torch.zeros(len(values), dtype=x.dtype).index_add_(0, inverse, ranks)
    counts = torch.zeros(len(values), dtype=x.dtype).index_add_(0, inverse, torch.ones_like(x))
    return (sums / counts)[inverse]


def _correlation(a: Float[Tensor, " n"], b: Float[Tensor, " n"]) -> float:
    a, b = a - a.mean(), b - b.mean()
    denominator = float(a.norm() * b.norm())
    return float((a * b).sum()) / denominator if denominator > 0 else math.nan
