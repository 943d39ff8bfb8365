"""What a patching sweep returns: labelled scores with both baselines."""

import dataclasses
import itertools
import math

import torch
from jaxtyping import Float
from torch import Tensor

from analysis._naming import component_label
from analysis.tables import Table
from hookedattn.viewer import html_table

MAX_TABLE_CELLS = 24  # per axis of a patching grid shown as a table

METHODS = ("activation patching", "path patching", "attribution patching")
DIRECTIONS = ("denoising", "noising")


@dataclasses.dataclass(frozen=True)
class PatchingResult:
    """The metric with each component patched, labelled by axis, with both baselines.

    `per_prompt[..., b]` is prompt b's metric with that component patched, `values` its
    mean over prompts, `clean` and `corrupted` the unpatched metrics. `normalised` is
    `(values - corrupted) / (clean - corrupted)` of the means: 1 where the patched run
    scores like the clean run, 0 where it scores like the corrupted one, in both
    directions. Denoising patches clean activations into the corrupted run (near 1: this
    component suffices to restore the behaviour); noising patches corrupted activations
    into the clean run (near 0: the behaviour needs it). NaN where clean and corrupted tie.
    """

    method: str
    direction: str
    kind: str
    axes: tuple[str, ...]
    labels: tuple[tuple[str, ...], ...]
    per_prompt: Float[Tensor, "... batch"]
    clean: Float[Tensor, " batch"]
    corrupted: Float[Tensor, " batch"]

    def __post_init__(self) -> None:
        assert self.method in METHODS and self.direction in DIRECTIONS
        shape = (*self.shape, self.clean.shape[0])
        assert tuple(self.per_prompt.shape) == shape, (self.per_prompt.shape, shape)

    @property
    def shape(self) -> tuple[int, ...]:
        """The size of each axis."""
        return tuple(len(ticks) for ticks in self.labels)

    @property
    def values(self) -> Float[Tensor, "..."]:
        """The patched metric, averaged over prompts."""
        return self.per_prompt.mean(dim=-1)

    @property
    def clean_baseline(self) -> float:
        """The unpatched clean metric, averaged over prompts."""
        return float(self.clean.mean())

    @property
    def corrupted_baseline(self) -> float:
        """The unpatched corrupted metric, averaged over prompts."""
        return float(self.corrupted.mean())

    @property
    def normalised(self) -> Float[Tensor, "..."]:
        """0 where a patched run scores like the corrupted run, 1 like the clean run."""
        gap = self.clean_baseline - self.corrupted_baseline
        return (self.values - self.corrupted_baseline) / gap

    @property
    def effect(self) -> Float[Tensor, "..."]:
        """How far each patch moves the metric from the run it was patched into."""
        base = self.corrupted_baseline if self.direction == "denoising" else self.clean_baseline
        return self.values - base

    def label(self, index: tuple[int, ...]) -> str:
        """`"L1H3"` for index `(1, 3)` of a `[layer head]` result, `"L1H3 pos 4"` of a
        `[layer pos head]` one, `"L0 pos 4"` of a `[layer pos]` one; a sender's own label."""
        ticks = {a: t[i] for a, t, i in zip(self.axes, self.labels, index, strict=True)}
        if "layer" not in ticks:
            return " ".join(ticks.values())
        head, pos = (int(ticks[a]) if a in ticks else None for a in ("head", "pos"))
        return component_label(int(ticks["layer"]), head, pos)

    def top(self, k: int = 5) -> Table:
        """The `k` components with the largest effect, largest first: a `Table` of
        `(component, normalised)` rows, as every result's `top` is."""
        order = self.effect.abs().flatten().argsort(descending=True)[:k]
        indices = list(itertools.product(*(range(n) for n in self.shape)))
        flat = self.normalised.flatten()
        rows = tuple((self.label(indices[i]), float(flat[i])) for i in order.tolist())
        title = f"top {len(rows)}: {self.method} {self.kind}, normalised (0 corrupted, 1 clean)"
        return Table(("component", "normalised"), rows, title)

    def __repr__(self) -> str:
        dims = ", ".join(f"{a}={n}" for a, n in zip(self.axes, self.shape, strict=True))
        top = "; ".join(f"{label}: {score:+.3f}" for label, score in self.top(3).rows)
        return (
            f"PatchingResult({self.method}, {self.direction}, {self.kind} [{dims}], "
            f"clean {self.clean_baseline:.4g}, corrupted {self.corrupted_baseline:.4g}; "
            f"largest normalised effects: {top})"
        )

    def _repr_html_(self) -> str:
        """A notebook's table: the normalised scores as a grid (two axes that fit), or the
        largest effects, under the baselines."""
        caption = (
            f"{self.method}, {self.direction}, {self.kind} [{' '.join(self.axes)}]: "
            f"clean {self.clean_baseline:.4g}, corrupted {self.corrupted_baseline:.4g}"
        )
        shape = self.shape
        if len(shape) == 2 and max(shape) <= MAX_TABLE_CELLS:
            columns = (f"{self.axes[0]} \\ {self.axes[1]}", *map(str, self.labels[1]))
            grid = self.normalised.tolist()
            rows = [(str(t), *grid[i]) for i, t in enumerate(self.labels[0])]
            return html_table(
                columns, rows, caption, "normalised: 0 corrupted, 1 clean", shade=True
            )
        k = min(10, math.prod(shape))
        rows = list(self.top(k).rows)
        note = f"the {k} largest effects of {math.prod(shape)}; view.patching(result) shows all"
        return html_table(("component", "normalised"), rows, caption, note, shade=True)


@dataclasses.dataclass(frozen=True)
class PatchingComparison:
    """An approximate sweep (attribution patching) against the exact one, component by component.

    `error` is approximate minus exact normalised score; `worst(k)` lists where they
    disagree most. Attribution patching is exact for a metric linear in the activation;
    it errs where the patch moves through a nonlinearity far from where the gradient was
    taken: a saturated softmax, a norm's scale, an MLP's kink.
    """

    approx: PatchingResult
    exact: PatchingResult

    def __post_init__(self) -> None:
        a, e = self.approx, self.exact
        if (a.kind, a.axes, a.labels, a.direction) != (e.kind, e.axes, e.labels, e.direction):
            raise ValueError(
                f"cannot compare {a.kind} [{' '.join(a.axes)}] ({a.direction}) with "
                f"{e.kind} [{' '.join(e.axes)}] ({e.direction}): patch the same components "
                f"in the same direction"
            )

    @property
    def axes(self) -> tuple[str, ...]:
        """The axes both results share."""
        return self.exact.axes

    @property
    def labels(self) -> tuple[tuple[str, ...], ...]:
        """The tick labels both results share."""
        return self.exact.labels

    @property
    def error(self) -> Float[Tensor, "..."]:
        """Approximate minus exact normalised score."""
        return self.approx.normalised - self.exact.normalised

    @property
    def correlation(self) -> float:
        """Pearson correlation of the two normalised maps (NaN where one is constant)."""
        both = torch.stack([self.approx.normalised.flatten(), self.exact.normalised.flatten()])
        return float(torch.corrcoef(both)[0, 1])

    def worst(self, k: int = 5) -> list[tuple[str, float, float]]:
        """The `k` components where they disagree most: `(label, approx, exact)`."""
        order = self.error.abs().flatten().argsort(descending=True)[:k]
        indices = list(itertools.product(*(range(n) for n in self.exact.shape)))
        approx, exact = self.approx.normalised.flatten(), self.exact.normalised.flatten()
        return [
            (self.exact.label(indices[i]), float(approx[i]), float(exact[i]))
            for i in order.tolist()
        ]

    def __repr__(self) -> str:
        worst = "; ".join(f"{lab}: {a:+.3f} vs {e:+.3f}" for lab, a, e in self.worst(3))
        return (
            f"PatchingComparison({self.approx.method} vs {self.exact.method}, "
            f"{self.exact.kind} [{' '.join(self.axes)}]: max |error| "
            f"{float(self.error.abs().max()):.3g}, correlation {self.correlation:.3f}; "
            f"worst: {worst})"
        )


def compare_patching(approx: PatchingResult, exact: PatchingResult) -> PatchingComparison:
    """Where an approximate sweep disagrees with the exact one (see `PatchingComparison`)."""
    return PatchingComparison(approx, exact)
