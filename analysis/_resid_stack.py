"""Stacks of residual-stream vectors with labels: `Decomposition` and `AccumulatedResid`.

A `Decomposition` is a set of components that add up to one residual stream (or to its
normalised form, after `apply_ln_to_stack`); an `AccumulatedResid` is the stream itself at
successive points, each entry a whole stream. Both index by label (`decomp["L1H2"]`), rank
their entries by norm (`.top(k)`), and print as a short summary.
"""

import dataclasses
import difflib

import torch
from einops import reduce
from jaxtyping import Float
from torch import Tensor

from analysis.tables import Table
from hookedattn.core.names import get_act_name
from hookedattn.core.tolerances import tolerance
from hookedattn.viewer import html_table

Stack = Float[Tensor, "component batch pos d_model"]


class DecompositionError(ValueError):
    """Components that should add up to a cached activation do not, beyond rounding."""


def label_index(labels: tuple[str, ...], label: str, what: str) -> int:
    """The position of `label` in `labels`; a `KeyError` names the closest labels."""
    if not isinstance(label, str):
        raise KeyError(f"{what} entries are indexed by label (a str), got {label!r}")
    try:
        return labels.index(label)
    except ValueError:
        close = difflib.get_close_matches(label, labels, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        shown = ", ".join(labels[:8]) + (", ..." if len(labels) > 8 else "")
        raise KeyError(f"no {what} entry {label!r}{hint} (labels: {shown})") from None


def _short_list(labels: tuple[str, ...], n: int = 6) -> str:
    if len(labels) <= n:
        return ", ".join(labels)
    return ", ".join(labels[: n - 2]) + ", ..., " + ", ".join(labels[-2:])


MAX_TABLE_ROWS = 40  # a notebook table beyond this shows the largest entries only


@dataclasses.dataclass(frozen=True, repr=False)
class ResidStack:
    """Labelled residual-stream vectors `[component batch pos d_model]`, at one point.

    `site` and `layer` name the point (`"resid_pre", 2` is the stream entering block 2;
    the final stream, read by `ln_final`, is `"resid_post"` of the last layer).
    `normalized_by` is the norm module the entries have been passed through, if any.
    """

    components: Stack
    labels: tuple[str, ...]
    site: str
    layer: int
    normalized_by: str | None = None

    def __post_init__(self) -> None:
        if len(self.labels) != self.components.shape[0]:
            raise ValueError(f"{len(self.labels)} labels for {self.components.shape[0]} components")
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"labels must be unique, got {self.labels}")

    @property
    def hook_name(self) -> str:
        """The full hook name of the stream this stack describes."""
        return get_act_name(self.site, self.layer)

    def __getitem__(self, label: str) -> Float[Tensor, "batch pos d_model"]:
        return self.components[label_index(self.labels, label, type(self).__name__)]

    def __contains__(self, label: object) -> bool:
        return label in self.labels

    def __len__(self) -> int:
        return len(self.labels)

    def norms(self) -> Float[Tensor, "component batch pos"]:
        """The L2 norm of every entry at every position."""
        return self.components.norm(dim=-1)

    def to_table(self, batch: int = 0, pos: int = -1) -> Table:
        """Every entry, in order, with its norm at one batch element and position."""
        norms = self.norms()[:, batch, pos].tolist()
        rows = tuple(zip(self.labels, norms, strict=True))
        return Table(("label", "norm"), rows, f"{self._title()} at batch {batch}, pos {pos}")

    def top(self, k: int = 10, batch: int = 0, pos: int = -1) -> Table:
        """The `k` entries of largest norm at one batch element and position."""
        rows = sorted(self.to_table(batch, pos).rows, key=lambda row: -row[1])[:k]
        return Table(("label", "norm"), tuple(rows), f"top {k} of {self._title()}")

    def _title(self) -> str:
        through = f" through {self.normalized_by}" if self.normalized_by else ""
        return f"{type(self).__name__} of {self.hook_name}{through}"

    def __repr__(self) -> str:
        _, batch, pos, d_model = self.components.shape
        dtype = str(self.components.dtype).removeprefix("torch.")
        return (
            f"{self._title()}: {len(self)} × [batch={batch} pos={pos} d_model={d_model}] "
            f"{dtype}: {_short_list(self.labels)}"
        )

    def _repr_html_(self, batch: int = 0, pos: int = -1) -> str:
        """A notebook's table: each component's norm at one position (the largest, where
        there are many)."""
        table = self.to_table(batch, pos)
        rows, note = table.rows, f"norms at batch {batch}, pos {pos}"
        if len(rows) > MAX_TABLE_ROWS:
            rows = self.top(MAX_TABLE_ROWS, batch, pos).rows
            note += f"; the {MAX_TABLE_ROWS} largest of {len(table.rows)} (.to_table() has all)"
        return html_table(table.columns, rows, f"{self!r}", note, shade=True)


@dataclasses.dataclass(frozen=True, repr=False)
class Decomposition(ResidStack):
    """Components that sum to the residual stream at one point (or to its normalised form).

    Labels: `embed`, `pos_embed`, `L0_attn` / `L0_mlp` (whole sublayers, biases included),
    `L0H3` (one head's result), `L0_attn_bias` (`b_O`), `L0N42` (one neuron's write),
    `L0_mlp_bias` (`b_out`), and after a norm with a bias, that bias (`ln_final_bias`;
    `L0_ln1_post_bias` for a LayerNorm after a sublayer, which is part of what it writes:
    see `analysis.decomposition`).
    """

    def sum(self) -> Float[Tensor, "batch pos d_model"]:
        """The stream the components add up to."""
        return reduce(self.components, "component batch pos d_model -> batch pos d_model", "sum")


@dataclasses.dataclass(frozen=True, repr=False)
class AccumulatedResid(ResidStack):
    """The residual stream itself at successive points: each entry is a whole stream.

    Labels: `L0_resid_pre`, `L0_resid_mid` (when asked for), `L1_resid_pre`, ..., and
    `final` for the stream the final norm reads. Entries do not add up to anything; the
    difference of two consecutive ones is what the sublayers between them wrote.
    `site` and `layer` name the last entry's point.
    """

    def _title(self) -> str:
        return f"AccumulatedResid up to {self.hook_name}"


def check_sums_to(
    components: Stack,
    target: Float[Tensor, "batch pos d_model"],
    what: str,
    computed_in: torch.dtype | None = None,
) -> None:
    """Raise `DecompositionError` unless `components` add up to `target` within rounding.

    The bound is the tolerance of the dtype the activations were computed in
    (`computed_in`, the model's; a cache recorded in float64 from a float32 model still
    carries float32 rounding) or of the components', whichever is coarser, relative to
    the sum of the components' magnitudes (the size of the rounding errors a sum can
    make), not to the target alone, which cancellation can make small.
    """
    dtypes = [components.dtype] + ([computed_in] if computed_in is not None else [])
    coarsest = max(dtypes, key=lambda dtype: torch.finfo(dtype).eps)
    tol = tolerance(coarsest)
    total = components.sum(0)
    error = (total - target).abs()
    bound = tol.atol + tol.rtol * components.abs().sum(0)
    if bool((error <= bound).all()):
        return
    worst = int((error - bound).flatten().argmax())
    batch, pos, dim = torch.unravel_index(torch.tensor(worst), error.shape)
    raise DecompositionError(
        f"{what} does not add up: largest error {float(error.max()):.3g} "
        f"(at batch {int(batch)}, pos {int(pos)}, d_model {int(dim)}: "
        f"{float(error[batch, pos, dim]):.3g} > bound {float(bound[batch, pos, dim]):.3g}, "
        f"{str(coarsest).removeprefix('torch.')} tolerance {tol})"
    )
