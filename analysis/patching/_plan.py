"""Which patched variants run together, and what each pass costs.

Two facts about a causal transformer decide what a variant must recompute:

- an edit in block L leaves blocks 0..L-1 as they were: a pass starts at block L from the
  unpatched run's `resid_pre`;
- an edit at position p leaves positions 0..p-1 as they were: a pass runs positions p..
  only, reading the earlier unpatched keys and values from a frozen KV cache. (Not in a
  hybrid model, nor with a lightning indexer (`index_topk`): what its mixers, or the
  indexer, read of earlier positions is not among the unpatched run's activations, so its
  passes run from position 0: `runs_from_the_start`.)

(A third, that an edit after its block mixes positions changes that block's output at its
own positions only, is used before planning: `_sweep` runs such blocks packed, several
variants to a sequence, and hands the planner what comes after them.)

Variants of one block run together, stacked on the batch axis, all from the pass's first
position (the earliest of theirs): a variant patched later in the sequence runs some
positions its patch cannot change, the price of one pass for many. (Each variant from its
own position, its earlier keys masked, was measured no faster: every sequence then holds
the keys of the pass's latest start.) Passes are cut where the estimated time of one more
call is less than that of the rows it saves, and so that each fits the memory budget.
The estimate is not a constant: the
fixed cost of a pass and the time per row are measured once per configuration and
sequence length (`pass_cost`), at a few sizes (a CPU gets slower per row once a pass
outgrows its caches; an accelerator faster).

More in `docs/guide/patching.md`.
"""

import bisect
import dataclasses
import time
from collections.abc import Callable, Sequence

import torch

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core import free_memory
from hookedattn.core.kv_cache import KeyValueCache, KeyValueCacheEntry
from hookedattn.core.parallel import same_on_every_rank


@dataclasses.dataclass(frozen=True)
class Extent:
    """Where a variant's edits lie: from block `layer` and position `start`; when `local`,
    block `layer`'s output changes at positions `start..window_end-1` only."""

    layer: int
    start: int
    window_end: int
    local: bool


@dataclasses.dataclass(frozen=True)
class Pass:
    """Variants run in one pass from block `layer`: each runs `rows` positions after the
    `n_past` unpatched keys and values before them. `again`: the rows are the patches'
    windows only, and each declared position after them runs once more through the last
    block, against the keys and values the windows left there."""

    layer: int
    variants: tuple[int, ...]
    n_past: int
    rows: int
    again: bool = False


def plan(
    model: HookedTransformer,
    extents: Sequence[Extent | None],
    batch: int,
    end: int,
    n_unembed: int | None,
    cost: "PassCost",
    memory_budget: int,
) -> list[Pass]:
    """Passes running every variant with an extent, positions up to `end` (the others
    change nothing). `n_unembed`: the number of declared positions, each unembedded, or
    None (every row unembedded). With declared positions, the last block runs only the
    patches' windows (`Pass.again`)."""
    passes = []
    for layer in sorted({e.layer for e in extents if e is not None}):
        chosen = [i for i, e in enumerate(extents) if e is not None and e.layer == layer]
        group = _Group(model, layer, [extents[i] for i in chosen], batch, end, n_unembed)
        for segment in group.segments(cost, memory_budget):
            passes.append(group.to_pass([chosen[i] for i in segment], segment))
    return passes


def runs_from_the_start(model: HookedTransformer) -> bool:
    """Whether every pass runs from position 0 (a hybrid model, or one with a lightning
    indexer: module docstring)."""
    mixers = model.cfg.mixers
    return (mixers is not None and mixers.holds_mixers) or model.cfg.index_topk is not None


def check_memory_budget(memory_budget: int) -> int:
    """`memory_budget` if it is a positive number of bytes, else a `ValueError`."""
    if memory_budget <= 0:
        raise ValueError(f"memory_budget must be a positive number of bytes, got {memory_budget}")
    return memory_budget


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
        cfg = model.cfg
        self.layer, self.batch, self.end, self.n_unembed = layer, batch, end, n_unembed
        self.later_blocks = cfg.n_layers - layer - 1
        from_start = runs_from_the_start(model)
        self.again = n_unembed is not None and self.later_blocks == 0 and not from_start
        # (offset, stop): the rows a variant runs, with `again` its window only.
        self.needs = [
            (0 if from_start else e.start,
             max(e.start + 1, min(e.window_end, end)) if self.again else end)
            for e in extents
        ]  # fmt: skip
        self.order = sorted(range(len(extents)), key=self.needs.__getitem__)
        self.row_floats = [row_floats(cfg, 0), row_floats(cfg, 1) - row_floats(cfg, 0)]
        self.kv_width = 2 * cfg.n_heads * cfg.d_head
        self.d_vocab, self.itemsize = cfg.d_vocab_out, itemsize(cfg)
        self.unembed_ratio = cfg.d_model * cfg.d_vocab_out / block_flops(cfg, end)

    @staticmethod
    def _shape(span: "_Span") -> tuple[int, int]:
        """`(n_past, rows)` of a pass over `span`."""
        return span.min_offset, span.max_stop - span.min_offset

    def to_pass(self, variants: list[int], members: Sequence[int]) -> Pass:
        """The `Pass` of `members` (indices into this group), naming the sweep's `variants`."""
        n_past, rows = self._shape(_Span.of([self.needs[i] for i in members]))
        return Pass(self.layer, tuple(variants), n_past, rows, self.again)

    def bytes(self, n_variants: int, n_past: int, rows: int) -> int:
        """Estimated peak bytes of a pass: its widest block, the keys and values before the
        rows in every block run, its logits and the full-length logits the metric reads."""
        base, per_key = self.row_floats
        widest = rows * (base + per_key * (n_past + rows))
        past = (self.later_blocks + 1) * self.kv_width * n_past
        n_logits = (rows if self.n_unembed is None else self.n_unembed) + 2 * rows + n_past
        per_sequence = widest + past + n_logits * self.d_vocab
        return n_variants * self.batch * per_sequence * self.itemsize

    def seconds(self, cost: "PassCost", n_variants: int, n_past: int, rows: int) -> float:
        """Estimated time of a pass (`PassCost`); a row unembedded counts as a block row in
        the ratio of their multiply-adds."""
        n_seq = n_variants * self.batch
        blocks = self.later_blocks + 1
        unembedded = rows if self.n_unembed is None else self.n_unembed
        block_rows = n_seq * (blocks * rows + unembedded * self.unembed_ratio)
        keys = n_seq * blocks * n_past
        calls = 1 + blocks
        if self.again:  # each declared position once more, against every earlier key
            block_rows += n_seq * self.n_unembed
            keys += n_seq * self.n_unembed * self.end
            calls += 2
        return cost.seconds(calls, block_rows, keys)

    def segments(self, cost: "PassCost", memory_budget: int) -> list[list[int]]:
        """`self.order` cut into contiguous passes of least estimated time in all (a
        dynamic programme over the cut points between runs of equal needs), each within
        `memory_budget` (a variant too large for it runs alone)."""
        runs = self._runs(memory_budget)
        best = [0.0] + [float("inf")] * len(runs)
        cut = [0] * (len(runs) + 1)
        for j in range(1, len(runs) + 1):
            span, count = None, 0
            for i in range(j - 1, -1, -1):
                span = _Span.of([self.needs[runs[i][0]]], span)
                count += len(runs[i])
                shape = self._shape(span)
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
            shape = self._shape(_Span.of([self.needs[run[0]]]))
            size = max(1, memory_budget // self.bytes(1, *shape))
            pieces += [run[k : k + size] for k in range(0, len(run), size)]
        return pieces


@dataclasses.dataclass(frozen=True)
class _Span:
    """The extremes of some variants' `(offset, stop)` needs, which fix their pass's shape."""

    min_offset: int
    max_stop: int

    @staticmethod
    def of(needs: Sequence[tuple[int, int]], span: "_Span | None" = None) -> "_Span":
        """The span of `needs`, together with `span` if given."""
        for offset, stop in needs:
            if span is None:
                span = _Span(offset, stop)
            span = _Span(min(span.min_offset, offset), max(span.max_stop, stop))
        assert span is not None
        return span


# ---------------------------------------------------------------------- sizes and costs


def itemsize(cfg: HookedTransformerConfig) -> int:
    """Bytes of one number in the model's dtype."""
    return torch.empty((), dtype=cfg.dtype).element_size()


def row_floats(cfg: HookedTransformerConfig, n_keys: int) -> int:
    """Numbers one position holds at the peak of a block attending to `n_keys` keys
    (residual stream, q/k/v/z, scores and pattern, MLP hidden layer, and the per-head
    input copies where the config makes them), with some slack."""
    return (
        8 * cfg.d_model
        + 6 * cfg.n_heads * cfg.d_head
        + 3 * cfg.n_heads * n_keys
        + 3 * (cfg.d_mlp or 0)
        + 2 * _input_copies(cfg) * cfg.d_model
    )


def _input_copies(cfg: HookedTransformerConfig) -> int:
    """Copies of the stream the attention reads per position (each, and its norm's output)."""
    if cfg.use_split_qkv_input:
        return cfg.n_heads + 2 * cfg.n_kv_heads
    return cfg.n_heads if cfg.use_attn_in else 0


def block_flops(cfg: HookedTransformerConfig, n_keys: int) -> int:
    """Multiply-adds of one position through one block attending to `n_keys` keys."""
    heads = cfg.n_heads * cfg.d_head
    return 4 * cfg.d_model * heads + 2 * heads * n_keys + 2 * cfg.d_model * (cfg.d_mlp or 0)


def default_memory_budget(model: HookedTransformer) -> int:
    """Bytes a pass may hold unless the caller says: a quarter of what the device has free."""
    free = free_memory(model.cfg.device)
    budget = free // 4 if free else 2**31
    return same_on_every_rank(model, budget)  # tensor-parallel ranks must plan alike


@dataclasses.dataclass(frozen=True)
class PassCost:
    """Measured: `pass_s` seconds per pass beyond its blocks' work (a whole pass of one
    position through one block: building it, its calls, its logits); `call_s` per further
    block call; `row_s[i]` per position a block runs, in passes of about `rows[i]`
    positions (the nearest size is read); `key_s` per earlier position a sequence holds
    in a block's KV cache."""

    pass_s: float
    call_s: float
    rows: tuple[int, ...]
    row_s: tuple[float, ...]
    key_s: float

    def seconds(self, calls: int, rows: float, keys: int) -> float:
        """Estimated time of `calls` block calls that run `rows` rows holding `keys` keys."""
        i = bisect.bisect_left(self.rows, rows)
        if i == len(self.rows) or (i and rows - self.rows[i - 1] < self.rows[i] - rows):
            i -= 1
        return self.pass_s + (calls - 1) * self.call_s + rows * self.row_s[i] + keys * self.key_s


_MEASURED: dict[tuple, PassCost] = {}


def pass_cost(
    model: HookedTransformer, n_pos: int, time_pass: Callable[[HookedTransformer, int], float]
) -> PassCost:
    """The measured `PassCost` of `model`'s blocks on `n_pos` positions (memoised).

    Measured on a one-block stand-in of the same configuration, so that hooks attached
    to `model` see only the sweep's own passes: `time_pass(stand_in, n_pos)` (the best
    time of a whole pass of one variant, one position); one position through the block;
    ever more sequences of `n_pos` until a call takes about 10 ms; and sequences of one
    position after a KV cache of the `n_pos - 1` before, built as a pass builds it.
    """
    cfg = _one_block(model.cfg)
    key = (repr(cfg), n_pos, torch.get_num_threads())
    if key not in _MEASURED:
        stand_in = HookedTransformer(cfg)
        _MEASURED[key] = _measure(stand_in, n_pos, time_pass(stand_in, n_pos))
    # The ranks of a tensor-parallel model measure different times: they plan with rank 0's.
    return same_on_every_rank(model, _MEASURED[key])


def _one_block(cfg: HookedTransformerConfig) -> HookedTransformerConfig:
    """`cfg` with its first block only: every per-layer field (one entry per block, such
    as `attn_types`, or a hybrid's `mixers.layers`) cut to its first entry."""
    per_layer = _first_entries(cfg, cfg.n_layers)
    if cfg.mixers is not None:
        mixers = dataclasses.replace(cfg.mixers, **_first_entries(cfg.mixers, cfg.n_layers))
        per_layer["mixers"] = mixers
        # The input hook point of a mixer in attention's place: only if the first block has one.
        first_mixes = mixers.layers[0] not in ("attention", "none")
        per_layer["use_hook_mixer_in"] = cfg.use_hook_mixer_in and first_mixes
    return dataclasses.replace(cfg, n_layers=1, **per_layer)


def _first_entries(fields_of: object, n_layers: int) -> dict[str, object]:
    """The first entry of each of `fields_of`'s fields that holds one entry per block."""
    return {
        f.name: value[:1]
        for f in dataclasses.fields(fields_of)
        if isinstance(value := getattr(fields_of, f.name), tuple | list)
        and len(value) == n_layers
        and f.name != "n_layers"
    }


def _measure(stand_in: HookedTransformer, n_pos: int, pass_s: float) -> PassCost:
    call_s = _best_seconds(stand_in, 1, 1, 0)
    rows, row_s = [], []
    n_seq = 1
    while True:
        seconds = _best_seconds(stand_in, n_seq, n_pos, 0)
        rows.append(n_seq * n_pos)
        row_s.append(max(seconds - call_s, 0.0) / (n_seq * n_pos))
        if seconds > 0.01 or n_seq >= 2**12:
            break
        n_seq *= 4
    n_seq, n_past = max(1, rows[-1] // n_pos), n_pos - 1
    if runs_from_the_start(stand_in):  # no pass reads a KV cache
        return PassCost(pass_s, call_s, tuple(rows), tuple(row_s), 0.0)
    with_keys = _best_seconds(stand_in, n_seq, 1, n_past)
    key_s = max(with_keys - _best_seconds(stand_in, n_seq, 1, 0), 0.0) / (n_seq * max(n_past, 1))
    return PassCost(pass_s, call_s, tuple(rows), tuple(row_s), key_s)


def clock(device: torch.device | str) -> Callable[[], float]:
    """The clock that costs are measured with: on a CPU running one thread, this process's
    CPU time, which leaves out the time spent waiting for a core (measured once per
    process on a busy machine, elapsed time misplanned every later sweep by up to a
    tenth); elsewhere elapsed time."""
    one_cpu_thread = torch.device(device).type == "cpu" and torch.get_num_threads() == 1
    return time.process_time if one_cpu_thread else time.perf_counter


def _best_seconds(stand_in: HookedTransformer, n_seq: int, n_pos: int, n_past: int) -> float:
    cfg = stand_in.cfg
    like = dict(dtype=cfg.dtype, device=cfg.device)
    resid = torch.randn(n_seq, n_pos, cfg.d_model, **like)
    # Values as wide as they are: latent attention's (DeepSeek V3's) are narrower than keys.
    keys = torch.randn(1, n_past, cfg.n_kv_heads, cfg.d_head, **like)
    values = torch.randn(1, n_past, cfg.n_kv_heads, cfg.d_value, **like)

    def run() -> None:
        past = None
        if n_past:
            # As a pass builds it: copied per sequence.
            k, v = (t.repeat(n_seq, 1, 1, 1) for t in (keys, values))
            entry = KeyValueCacheEntry(k, v, frozen=True)
            mask = torch.ones(n_seq, n_past, dtype=torch.long, device=cfg.device)
            past = KeyValueCache([entry], mask, frozen=True)
        stand_in(resid, start_at_layer=0, stop_at_layer=1, past_kv_cache=past)

    best, now = float("inf"), clock(resid.device)
    with torch.no_grad():
        for _ in range(3):
            if resid.is_cuda:
                torch.cuda.synchronize(resid.device)
            start = now()
            run()
            if resid.is_cuda:
                torch.cuda.synchronize(resid.device)
            best = min(best, now() - start)
    return best
