"""Patching when the metric reads the logits at a few declared positions (`metric_positions`).

A metric such as the logit difference at the final position reads one row of the logits.
Declaring the rows it reads lets a sweep skip all that those rows do not depend on,
without changing any number the metric sees:

- attention is causal, so positions after the last declared one never reach it: every
  pass stops there, and a patch beyond it leaves the metric as it was;
- a patch in the last block of a kind that changes its own position only (`LOCAL_KINDS`)
  reaches the logits at that position alone, so at an undeclared position it changes
  nothing and is not run;
- in the last block only the declared queries matter. Where the rows that change on the
  way into it end before a declared position (a patch in the last block, or a local
  patch in the block before), a pass runs those rows alone, keeping the last block's keys
  and values in an open KV cache, and then runs each later declared position alone
  against that cache;
- only the declared positions are unembedded.

Every step is a forward pass of the model's own blocks (`start_at_layer`, `stop_at_layer`,
`past_kv_cache`), so every hook point on the way fires. The metric gets logits that are
exact at the declared positions and NaN elsewhere, so that a metric reading an undeclared
position gives NaN: checked on the unpatched runs before a sweep and on every patched run.
Hooks attached to the model act in these passes as in any other: those that act on each
position alone give the numbers of the full computation; those that index positions see
a pass's own layout (the positions it runs, and in `side_by_side` many variants' rows).
"""

import dataclasses
import operator
from collections.abc import Mapping, Sequence

import torch
from einops import rearrange, repeat
from jaxtyping import Float
from torch import Tensor

from analysis.patching import side_by_side
from analysis.patching.components import LOCAL_KINDS, Component, component_masks
from analysis.patching.engine import (
    BaseRun,
    Edit,
    _by_variant,
    _edit_hook,
    _key_name,
    _rows,
    default_memory_budget,
    itemsize,
    merge_passes,
    row_floats,
)
from analysis.patching.inputs import Metric, metric_values
from hookedattn import HookedTransformer, KeyValueCache, KeyValueCacheEntry
from hookedattn.names import get_act_name


def declared_positions(metric_positions: object, n_pos: int) -> tuple[int, ...]:
    """`metric_positions` (an int or a sequence of ints; negative ones count from the end)
    as sorted, distinct positions in `0..n_pos-1`."""
    if _is_int(metric_positions):
        given = [metric_positions]
    elif isinstance(metric_positions, str) or not isinstance(metric_positions, Sequence | Tensor):
        raise TypeError(
            f"metric_positions must be a position or a sequence of positions (ints), "
            f"got {type(metric_positions).__name__}"
        )
    else:
        given = list(metric_positions)
    positions = set()
    for item in given:
        if not _is_int(item):
            raise TypeError(f"metric_positions must hold ints, got {item!r}")
        index = operator.index(item)
        if not -n_pos <= index < n_pos:
            raise ValueError(
                f"metric_positions: {index} is not a position of {n_pos} tokens "
                f"(valid: {-n_pos}..{n_pos - 1})"
            )
        positions.add(index % n_pos)
    if not positions:
        raise ValueError(
            "metric_positions is empty: declare the positions whose logits the metric "
            "reads, or pass None"
        )
    return tuple(sorted(positions))


def _is_int(value: object) -> bool:
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


# ------------------------------------------------------------------ the metric's reads
def nan_except(
    logits: Float[Tensor, "batch pos d_vocab_out"], kept: Sequence[int]
) -> Float[Tensor, "batch pos d_vocab_out"]:
    """A copy of `logits` that is NaN at every position but `kept`."""
    out = torch.full_like(logits, torch.nan)
    out[:, list(kept)] = logits[:, list(kept)]
    return out


def _same(a: Tensor, b: Tensor) -> bool:
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def check_metric_reads(
    metric: Metric, base: BaseRun, declared: Sequence[int], given: object
) -> None:
    """A `ValueError` naming the undeclared positions whose logits `metric` reads, if any:
    its value on `base` must not change when they are NaN."""
    n_pos = base.logits.shape[1]
    if _same(metric_values(metric, nan_except(base.logits, declared)), base.metric):
        return
    reads = [
        q
        for q in range(n_pos)
        if q not in declared
        and not _same(
            metric_values(metric, nan_except(base.logits, [p for p in range(n_pos) if p != q])),
            base.metric,
        )
    ]
    where = f"positions {reads}" if reads else "positions outside them taken together"
    hint = f"pass metric_positions={sorted({*declared, *reads})} or None" if reads else "pass None"
    raise ValueError(
        f"metric_positions={given!r} declares positions {list(declared)} of {n_pos}, but the "
        f"metric also reads the logits at {where} (its value changes when they are NaN); "
        f"{hint}"
    )


def declared_metric(
    metric: Metric,
    logits: Float[Tensor, "variant batch declared d_vocab_out"],
    declared: Sequence[int],
    n_pos: int,
    labels: Sequence[str],
    unpatched: Float[Tensor, " batch"],
) -> Float[Tensor, "variant batch"]:
    """`metric` of each variant's logits, NaN outside the declared positions; a
    `ValueError` if that gives NaN where the `unpatched` metric is not NaN, since then
    the metric read an undeclared position."""
    n_variants, batch, _, d_vocab = logits.shape
    full = logits.new_full((n_variants, batch, n_pos, d_vocab), torch.nan)
    full[:, :, list(declared)] = logits
    values = torch.stack([metric_values(metric, variant) for variant in full])
    read_nan = values.isnan() & ~unpatched.isnan()
    if bool(read_nan.any()):
        label = labels[int(read_nan.any(dim=1).nonzero()[0])]
        raise ValueError(
            f"the metric gave NaN with {label} patched, on logits that are NaN outside "
            f"metric_positions {list(declared)}: it reads another position (on the "
            f"unpatched runs it did not). Declare every position it reads, or pass "
            f"metric_positions=None"
        )
    return values


# ------------------------------------------------------------------ what a pass runs
def reaches(component: Component, declared: Sequence[int], n_layers: int) -> bool:
    """Whether patching `component` can change the logits at a declared position."""
    if component.pos is None:
        return True
    if component.pos > declared[-1]:
        return False
    local_in_last = component.layer == n_layers - 1 and component.name in LOCAL_KINDS
    return not local_in_last or component.pos in declared


@dataclasses.dataclass(frozen=True)
class PassShape:
    """The rows one pass runs, for patches of `components` (see the module docstring).

    Block `layer` runs positions `start..window_end-1` and the blocks after it
    `start..rows_end-1`; of those, the declared ones are unembedded (`unembedded`). The
    declared positions in `again` then run through the last block once more, against the
    keys and values the pass left there. The other declared positions keep their
    unpatched logits: the pass changes nothing there.
    """

    layer: int
    start: int
    window_end: int
    rows_end: int
    unembedded: tuple[int, ...]
    again: tuple[int, ...]

    def rows(self, n_layers: int) -> int:
        """Rows run per sequence: positions times blocks, plus positions unembedded."""
        later = n_layers - self.layer - 1
        blocks = (self.window_end - self.start) + later * (self.rows_end - self.start)
        return blocks + len(self.unembedded) + 2 * len(self.again)


def pass_shape(
    n_layers: int, components: Sequence[Component], declared: Sequence[int]
) -> PassShape:
    """What a pass patching every one of `components` (one per variant) has to run."""
    last, end = n_layers - 1, declared[-1] + 1
    layer = min(c.layer for c in components)
    positions = [c.pos for c in components]
    start = 0 if None in positions else min(min(positions), end)
    edit_end = None if None in positions else min(max(positions) + 1, end)
    one_layer = all(c.layer == layer for c in components)
    local = one_layer and all(c.name in LOCAL_KINDS for c in components)
    # Whether the rows that change on the way into the last block end at edit_end.
    confined = (
        edit_end is not None and one_layer and (layer == last or (layer == last - 1 and local))
    )
    window_end = edit_end if edit_end is not None and (local or confined) else end
    rows_end = edit_end if confined else end
    # A local patch in the last block changes no later position; any other, every one.
    later = () if not confined or (layer == last and local) else declared
    return PassShape(
        layer,
        start,
        window_end,
        rows_end,
        tuple(p for p in declared if start <= p < rows_end),
        tuple(p for p in later if p >= rows_end),
    )


def bytes_per_sequence(model: HookedTransformer, shape: PassShape, n_pos: int) -> int:
    """Estimated peak bytes of one sequence in a pass of `shape` (see `PassShape`).

    The rows run, the unpatched keys and values before `start` in every block run, each
    position run again with its own copy of the last block's keys and values, the
    declared logits, and the full-length logits handed to the metric.
    """
    cfg = model.cfg
    kv_row = 2 * cfg.n_heads * cfg.d_head
    n_keys = shape.rows_end
    run = (shape.rows_end - shape.start) * row_floats(model, n_keys)
    prefix = (cfg.n_layers - shape.layer) * kv_row * shape.start
    again = sum(kv_row * p + row_floats(model, p + 1) for p in shape.again)
    n_logits = len(shape.unembedded) + len(shape.again) + n_pos
    return itemsize(model) * (run + prefix + again + n_logits * cfg.d_vocab_out)


# ------------------------------------------------------------------ running a pass
def run_declared(
    model: HookedTransformer,
    base: BaseRun,
    n_variants: int,
    edits: Sequence[Edit],
    shape: PassShape,
    declared: Sequence[int],
) -> Float[Tensor, "variant batch declared d_vocab_out"]:
    """The logits at the declared positions of `n_variants` edited copies of `base`.

    Every edit must lie in block `shape.layer` or later, at position `shape.start` or
    later, and (where `shape.window_end < shape.rows_end`) in block `shape.layer` only,
    downstream of where it mixes positions, before `shape.window_end`.
    """
    n_layers = model.cfg.n_layers
    column = {p: i for i, p in enumerate(declared)}
    logits = base.logits[:, list(declared)].repeat(n_variants, 1, 1, 1)
    if shape.start > declared[-1]:  # every edit lies after the declared positions
        return logits
    # The last block's keys and values up to the last position run again, per variant:
    # unpatched, until the pass writes the rows it changes.
    last_kv = _unpatched_kv(model, base, n_variants, n_layers - 1, max(shape.again, default=0))
    with torch.no_grad():
        resid, kept = _first_pass(model, base, n_variants, edits, shape, last_kv)
        if shape.unembedded:
            rows = [p - shape.start for p in shape.unembedded]
            if len(rows) < resid.shape[1]:
                resid = resid[:, rows]
            unembedded = model(resid, start_at_layer=n_layers)
            logits[:, :, [column[p] for p in shape.unembedded]] = _by_variant(
                unembedded, n_variants
            )
        if shape.again:
            changed = slice(shape.start, shape.rows_end)
            for full, new in zip(last_kv, (kept.past_keys, kept.past_values), strict=True):
                full[:, changed] = new[:, changed]
            again = _run_again(model, base, n_variants, last_kv, shape.again)
            logits[:, :, [column[p] for p in shape.again]] = again
    return logits


def _unpatched_kv(
    model: HookedTransformer, base: BaseRun, n_variants: int, layer: int, n_past: int
) -> tuple[Float[Tensor, "sequence pos head d_head"], Float[Tensor, "sequence pos head d_head"]]:
    """Block `layer`'s unpatched keys and values of positions `..n_past-1`, per variant
    (new tensors, which the pass may write to)."""
    return tuple(
        base.cache[name][:, :n_past].repeat(n_variants, 1, 1, 1)
        for name in (_key_name(model, layer), get_act_name("v", layer))
    )


def _first_pass(
    model: HookedTransformer,
    base: BaseRun,
    n_variants: int,
    edits: Sequence[Edit],
    shape: PassShape,
    last_kv: tuple[Tensor, Tensor],
) -> tuple[Float[Tensor, "variant_batch run_pos d_model"], KeyValueCacheEntry]:
    """Positions `start..rows_end-1` from block `layer` through the last block: the
    residual stream they leave, and the last block's keys and values of `..rows_end-1`.

    `last_kv`: the last block's unpatched keys and values, per variant, of at least
    positions `..start-1`.
    """
    n_layers, layer, start = model.cfg.n_layers, shape.layer, shape.start
    hooks = [(e.hook, _edit_hook(e, n_variants, start, shape.window_end)) for e in edits]
    resid = _rows(base, layer, start, shape.window_end, n_variants)
    past = _prefix(model, base, n_variants, layer, start, last_kv)
    if shape.window_end == shape.rows_end:
        with model.hooks(fwd_hooks=hooks):
            resid = model(resid, start_at_layer=layer, stop_at_layer=n_layers, past_kv_cache=past)
    else:  # local patches: block `layer` changes the window only, the later blocks more
        with model.hooks(fwd_hooks=hooks):
            resid = model(resid, start_at_layer=layer, stop_at_layer=layer + 1, past_kv_cache=past)
        rest = _rows(base, layer + 1, shape.window_end, shape.rows_end, n_variants)
        resid = model(
            torch.cat([resid, rest], dim=1),
            start_at_layer=layer + 1,
            stop_at_layer=n_layers,
            past_kv_cache=past,
        )
    return resid, past[n_layers - 1]


def _prefix(
    model: HookedTransformer,
    base: BaseRun,
    n_variants: int,
    first_layer: int,
    n_past: int,
    last_kv: tuple[Tensor, Tensor],
) -> KeyValueCache:
    """The unpatched keys and values of positions `..n_past-1`, per variant, in blocks
    `first_layer..` (the last block's from `last_kv`). The last block's entry is open: it
    keeps what the pass appends."""
    n_layers = model.cfg.n_layers
    last = n_layers - 1
    entries = {}
    for layer in range(first_layer, n_layers):
        if layer == last and last_kv[0].shape[1] >= n_past:
            keys, values = (x[:, :n_past] for x in last_kv)
        else:
            keys, values = _unpatched_kv(model, base, n_variants, layer, n_past)
        entries[layer] = KeyValueCacheEntry(keys, values, frozen=layer < last)
    # Blocks before first_layer do not run, so their entries are never read.
    filled = [entries[max(layer, first_layer)] for layer in range(n_layers)]
    batch = base.tokens.shape[0]
    mask = base.tokens.new_ones(n_variants * batch, n_past)
    return KeyValueCache(filled, mask, frozen=True)


def _run_again(
    model: HookedTransformer,
    base: BaseRun,
    n_variants: int,
    kv: tuple[Tensor, Tensor],
    again: Sequence[int],
) -> Float[Tensor, "variant batch again d_vocab_out"]:
    """Each position of `again` alone through the last block, attending to the keys and
    values `kv` of the positions before it (per variant).

    The positions go side by side along the batch axis, each with the keys before it; a
    shorter list is padded at its end and its padding masked, so that each query sees
    exactly its own causal past and gets its own position (which rotary models read).
    """
    last = model.cfg.n_layers - 1
    keys, values = kv
    n_rows, n_past = len(again), max(again)
    resid = repeat(
        base.cache[get_act_name("resid_pre", last)][:, list(again)],
        "batch row d_model -> (row variant batch) 1 d_model",
        variant=n_variants,
    )
    mask = base.tokens.new_ones(keys.shape[:2])
    if n_rows > 1:
        keys, values = (
            repeat(x, "sequence pos head d_head -> (row sequence) pos head d_head", row=n_rows)
            for x in (keys, values)
        )
        row_end = torch.tensor(again, device=mask.device)
        before = torch.arange(n_past, device=mask.device) < row_end[:, None]
        mask = repeat(before.long(), "row pos -> (row sequence) pos", sequence=mask.shape[0])
    entry = KeyValueCacheEntry(keys, values, frozen=True)
    past = KeyValueCache([entry] * model.cfg.n_layers, mask, frozen=True)
    logits = model(resid, start_at_layer=last, past_kv_cache=past)
    return rearrange(
        logits,
        "(row variant batch) 1 d_vocab_out -> variant batch row d_vocab_out",
        row=n_rows,
        variant=n_variants,
    )


# ------------------------------------------------------------------ sweeps
def plan_declared(
    model: HookedTransformer,
    components: Sequence[Component],
    indices: Sequence[int],
    batch: int,
    n_pos: int,
    declared: Sequence[int],
    memory_budget: int,
) -> list[list[int]]:
    """`indices` of `components`, in batch-stacked passes that fit `memory_budget` bytes
    (see `engine.plan_chunks`)."""
    n_layers = model.cfg.n_layers

    def shape_of(chunk: list[int]) -> PassShape:
        return pass_shape(n_layers, [components[i] for i in chunk], declared)

    return merge_passes(
        components,
        indices,
        lambda chunk: len(chunk) * batch * bytes_per_sequence(model, shape_of(chunk), n_pos),
        lambda chunk: len(chunk) * batch * shape_of(chunk).rows(n_layers),
        memory_budget,
    )


def sweep_declared(
    model: HookedTransformer,
    base: BaseRun,
    sources: Mapping[str, Tensor],
    components: Sequence[Component],
    metric: Metric,
    declared: Sequence[int],
    memory_budget: int | None = None,
) -> Float[Tensor, "component batch"]:
    """`engine.sweep` for a metric that reads the logits at the `declared` positions only.

    A component that cannot reach them keeps the unpatched metric, without running. The
    others run side by side where they can (`side_by_side`), else stacked on the batch axis.
    """
    batch, n_pos = base.tokens.shape
    n_layers = model.cfg.n_layers
    budget = default_memory_budget(model) if memory_budget is None else memory_budget
    if budget <= 0:
        raise ValueError(f"memory_budget must be a positive number of bytes, got {budget}")
    reached = [i for i, c in enumerate(components) if reaches(c, declared, n_layers)]
    beside = [i for i in reached if side_by_side.eligible(model, components[i], declared)]
    stacked = sorted(set(reached) - set(beside))
    passes = [
        *((chunk, True) for chunk in side_by_side.plan_side_by_side(
            model, components, beside, batch, declared, budget
        )),
        *((chunk, False) for chunk in plan_declared(
            model, components, stacked, batch, n_pos, declared, budget
        )),
    ]  # fmt: skip
    out = base.metric.repeat(len(components), 1)
    for chunk, is_beside in passes:
        chosen = [components[i] for i in chunk]
        hooks = list(dict.fromkeys(c.hook_name for c in chosen))
        edits = [
            Edit(hook, component_masks(chosen, hook, sources[hook].shape[1:]), sources[hook])
            for hook in hooks
        ]
        if is_beside:
            logits = side_by_side.run_side_by_side(model, base, chosen, edits, declared)
        else:
            shape = pass_shape(n_layers, chosen, declared)
            logits = run_declared(model, base, len(chosen), edits, shape, declared)
        labels = [c.label() for c in chosen]
        out[chunk] = declared_metric(metric, logits, declared, n_pos, labels, base.metric)
    return out
