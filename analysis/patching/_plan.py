"""Which patched variants run together, and what each pass runs.

Three facts about a causal transformer decide what a variant must recompute:

- an edit in block L leaves blocks 0..L-1 as they were: a pass starts at block L from the
  unpatched run's `resid_pre`;
- an edit at position p leaves positions 0..p-1 as they were: a pass runs positions p..
  only, reading the earlier unpatched keys and values from a frozen KV cache;
- an edit downstream of where its block mixes positions (a head's output, an MLP, ...;
  `LOCAL_KINDS`) changes that block's output at its own positions only: the block runs
  on those, and the later blocks from there on.

Variants of one block run together, stacked on the batch axis. Each runs from its own
first position (its earlier keys masked in the shared KV cache, so a query sees its own
causal past and gets its own position, which rotary models read), so no rows are
wasted on positions a patch cannot change, except the padding to the pass's longest
variant. Passes are cut where the estimated time (`_cost`) of one more call is less than
that of the padding, and so that each fits the memory budget.
"""

import dataclasses
from collections.abc import Sequence

from analysis.patching._cost import (
    PassCost,
    block_flops,
    itemsize,
    row_floats,
    unembed_flops,
)
from hookedattn import HookedTransformer


@dataclasses.dataclass(frozen=True)
class Extent:
    """Where a variant's edits lie: from block `layer` and position `start`; when `local`,
    block `layer`'s output changes at positions `start..window_end-1` only. `keyed`: an
    edit has a key axis (scores, patterns), which fixes every row's place in the pass."""

    layer: int
    start: int
    window_end: int
    local: bool
    keyed: bool


@dataclasses.dataclass(frozen=True)
class Pass:
    """Variants run in one pass from block `layer`: variant `variants[i]` runs positions
    `offsets[i]..`, after `n_past` unpatched keys and values (those at `offsets[i]` and
    later masked). Block `layer` runs `first_rows` rows, the later blocks `rows`. `again`: the
    rows are the patches' windows only, and each declared position after them runs once
    more through the last block, against the keys and values the windows left there."""

    layer: int
    variants: tuple[int, ...]
    offsets: tuple[int, ...]
    n_past: int
    first_rows: int
    rows: int
    again: bool = False

    @property
    def uniform(self) -> bool:
        """Whether every variant runs from `n_past`, so the KV cache needs no mask."""
        return all(offset == self.n_past for offset in self.offsets)


@dataclasses.dataclass(frozen=True)
class Need:
    """What one variant needs from a pass: rows from `offset` in its first and later blocks."""

    offset: int
    first: int
    later: int


def plan(
    model: HookedTransformer,
    extents: Sequence[Extent | None],
    batch: int,
    end: int,
    n_unembed: int | None,
    cost: PassCost,
    memory_budget: int,
) -> list[Pass]:
    """Passes running every variant with an extent, positions up to `end` (the others
    change nothing). `n_unembed`: the number of declared positions, each unembedded, or
    None (every row unembedded). With declared positions, a block whose patches change
    only a window of rows on the way into the last block runs that window (`again`)."""
    if memory_budget <= 0:
        raise ValueError(f"memory_budget must be a positive number of bytes, got {memory_budget}")
    passes = []
    for layer in sorted({e.layer for e in extents if e is not None}):
        chosen = [i for i, e in enumerate(extents) if e is not None and e.layer == layer]
        group = _Group(model, layer, [extents[i] for i in chosen], batch, end, n_unembed)
        for segment in group.segments(cost, memory_budget):
            passes.append(group.to_pass([chosen[i] for i in segment], segment))
    return passes


class _Group:
    """The variants of one block, and the cost of running any run of them together."""

    def __init__(
        self,
        model: HookedTransformer,
        layer: int,
        extents: list[Extent],
        batch: int,
        end: int,
        n_unembed: int | None,
    ) -> None:
        self.model, self.layer, self.batch, self.n_unembed = model, layer, batch, n_unembed
        self.later_blocks = model.cfg.n_layers - layer - 1
        self.again = n_unembed is not None and all(_confined(e, self.later_blocks) for e in extents)
        # A local patch in the last block changes no position after its window.
        self.run_again = self.again and not (
            self.later_blocks == 0 and all(e.local for e in extents)
        )
        self.end = end
        self.needs = [_need(e, end, self.later_blocks, self.again) for e in extents]
        # Each variant from its own start needs room for the longest after the latest, and
        # an attention window counts keys by their place in the pass, not their position.
        room = max(n.offset for n in self.needs) + max(n.later for n in self.needs)
        self.own = (
            not any(e.keyed for e in extents)
            and room <= model.cfg.n_ctx
            and model.cfg.window_size is None
        )
        if not self.own:  # every row at its place: one offset, the first variant's
            self.needs = [
                Need(n.offset, n.offset + n.first, n.offset + n.later) for n in self.needs
            ]
        self.order = sorted(range(len(extents)), key=self._key)
        # Sizes the estimates read, once: the DP below evaluates them many times.
        cfg = model.cfg
        self.row_base = row_floats(model, 0)
        self.row_per_key = row_floats(model, 1) - self.row_base
        self.kv_width = 2 * cfg.n_heads * cfg.d_head
        self.d_vocab, self.itemsize = cfg.d_vocab_out, itemsize(model)
        self.unembed_ratio = unembed_flops(model) / block_flops(model, end)

    def _key(self, i: int) -> tuple[int, int]:
        need = self.needs[i]
        return (need.later, need.first) if self.own else (need.offset, need.later)

    def shape(self, members: Sequence[int]) -> tuple[int, int, int]:
        """`(n_past, first_rows, rows)` of a pass holding `members`."""
        return self._shape(_Span.of([self.needs[i] for i in members]))

    def _shape(self, span: "_Span") -> tuple[int, int, int]:
        if self.own:
            return span.max_offset, span.first, span.later
        return span.min_offset, span.first - span.min_offset, span.later - span.min_offset

    def to_pass(self, variants: list[int], members: Sequence[int]) -> Pass:
        """The `Pass` of `members` (indices into this group), naming the sweep's `variants`."""
        n_past, first_rows, rows = self.shape(members)
        offsets = tuple(self.needs[i].offset if self.own else n_past for i in members)
        return Pass(self.layer, tuple(variants), offsets, n_past, first_rows, rows, self.run_again)

    def bytes(self, n_variants: int, n_past: int, first_rows: int, rows: int) -> int:
        """Estimated peak bytes of a pass: its widest block, the keys and values before the
        rows in every block run, its logits and the full-length logits the metric reads."""
        widest = max(first_rows * (self.row_base + self.row_per_key * (n_past + first_rows)),
                     rows * (self.row_base + self.row_per_key * (n_past + rows)))  # fmt: skip
        past = (self.later_blocks + 1) * self.kv_width * n_past
        n_logits = (rows if self.n_unembed is None else self.n_unembed) + 2 * rows + n_past
        per_sequence = widest + past + n_logits * self.d_vocab
        return n_variants * self.batch * per_sequence * self.itemsize

    def seconds(self, cost: PassCost, n_variants: int, n_past: int, first: int, rows: int) -> float:
        """Estimated time of a pass (`_cost.PassCost`); a row unembedded counts as a
        block row in the ratio of their multiply-adds."""
        n_seq = n_variants * self.batch
        unembedded = rows if self.n_unembed is None else self.n_unembed
        later = self.later_blocks
        block_rows = n_seq * (first + later * rows + unembedded * self.unembed_ratio)
        keys = n_seq * (later + 1) * n_past
        calls = 2 + later + (first != rows and later > 0)
        if self.run_again:  # each declared position once more, against every earlier key
            block_rows += n_seq * self.n_unembed
            keys += n_seq * self.n_unembed * self.end
            calls += 2
        return cost.seconds(calls, block_rows, keys)

    def segments(self, cost: PassCost, memory_budget: int) -> list[list[int]]:
        """`self.order` cut into contiguous passes of least estimated time in all (a
        dynamic programme over the cut points between runs of equal needs), each within
        `memory_budget` (a variant too large for it runs alone)."""
        runs = self._runs(memory_budget)
        best = [0.0] + [float("inf")] * len(runs)
        cut = [0] * (len(runs) + 1)
        needs = [self.needs[run[0]] for run in runs]
        for j in range(1, len(runs) + 1):
            low, high, first, later, count = needs[j - 1].offset, 0, 0, 0, 0
            for i in range(j - 1, -1, -1):
                need = needs[i]
                low, high = min(low, need.offset), max(high, need.offset)
                first, later = max(first, need.first), max(later, need.later)
                count += len(runs[i])
                shape = (high, first, later) if self.own else (low, first - low, later - low)
                if i < j - 1 and self.bytes(count, *shape) > memory_budget:
                    break
                total = best[i] + self.seconds(cost, count, *shape)
                if total < best[j]:
                    best[j], cut[j] = total, i
        segments, j = [], len(runs)
        while j:
            segments.append([m for run in runs[cut[j] : j] for m in run])
            j = cut[j]
        return segments[::-1]

    def _runs(self, memory_budget: int) -> list[list[int]]:
        """`self.order` in runs of equal needs, each run within `memory_budget`."""
        runs: list[list[int]] = []
        for i in self.order:
            if runs and self.needs[runs[-1][0]] == self.needs[i]:
                runs[-1].append(i)
            else:
                runs.append([i])
        pieces = []
        for run in runs:
            size = max(1, memory_budget // self.bytes(1, *self.shape(run[:1])))
            pieces += [run[k : k + size] for k in range(0, len(run), size)]
        return pieces


@dataclasses.dataclass(frozen=True)
class _Span:
    """The extremes of some variants' needs, which fix the shape of their pass."""

    min_offset: int
    max_offset: int
    first: int
    later: int

    @staticmethod
    def of(needs: Sequence[Need], span: "_Span | None" = None) -> "_Span":
        """The span of `needs`, together with `span` if given."""
        if span is None:
            span = _Span(needs[0].offset, needs[0].offset, needs[0].first, needs[0].later)
        for n in needs:
            span = _Span(
                min(span.min_offset, n.offset),
                max(span.max_offset, n.offset),
                max(span.first, n.first),
                max(span.later, n.later),
            )
        return span


def _confined(extent: Extent, later_blocks: int) -> bool:
    """Whether a variant changes only its window of rows on the way into the last block:
    its edits lie in the last block, or are local in the block before it."""
    return later_blocks == 0 or (later_blocks == 1 and extent.local)


def _need(extent: Extent, end: int, later_blocks: int, again: bool) -> Need:
    """The rows a variant runs from its own start: in block `layer`, its window if local,
    else up to `end`; in the later blocks (if any) up to `end`; with `again`, its window
    in every block."""
    start = extent.start
    if again:
        window = max(1, min(extent.window_end, end) - start)
        return Need(start, window, window)
    first = (min(extent.window_end, end) if extent.local else end) - start
    later = first if later_blocks == 0 else end - start
    return Need(start, first, later)
