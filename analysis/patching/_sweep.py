"""Patched variants of one forward, run together: the batched `_reference`.

A sweep is a base run and `n_variants` variants of it, each a set of region replacements
(`Edit`: in variant i, the region `mask[i]` of one activation takes `source`'s values).
`sweep` gives the metric of every variant, `record` the activations some hook points see
in each. Every step is a forward of the model's own blocks (`start_at_layer`,
`stop_at_layer`, `past_kv_cache`), so every hook point on the way fires, and hooks
attached to the model act as in any other forward (those that index positions or the
batch see a pass's own rows). Two kinds of pass:

- *packed*: a variant whose edits all lie after where their block mixes positions (a
  head's output, an MLP, ...: `LOCAL_KINDS`) changes that block's output at its own
  positions only, so variants of one block with disjoint windows share one sequence: one
  pass gives all of them the block's output (their logits after the last block; else each
  goes on from the next block with its window of the pack).
- *planned* (`_plan`): variants stacked along the batch axis (`(variant batch)`), from
  the pass's first block and position, after the unpatched keys and values before it (a
  frozen KV cache; a hybrid's passes start at 0).

With `declared` positions (the only ones whose logits the metric reads) a pass stops at
the last of them, unembeds only them, and a variant that cannot reach them does not run;
the metric gets NaN logits elsewhere, so reading another position is caught. Other
packages reach `sweep` and `Edit` through `engine`; `docs/guide/patching.md` has the rest.
"""

import dataclasses
import heapq
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import torch
from einops import rearrange, repeat
from jaxtyping import Bool, Float, Int
from torch import Tensor

from analysis.patching._components import LAYOUTS, LOCAL_KINDS, Component, masks_at
from analysis.patching._inputs import BaseRun, Metric, base_run, key_name, value_name
from analysis.patching._plan import (
    Extent,
    Pass,
    check_memory_budget,
    clock,
    default_memory_budget,
    itemsize,
    pass_cost,
    plan,
    row_floats,
    runs_from_the_start,
)
from analysis.patching._readout import Piece, Readout, again, declared_logits, pass_pieces
from hookedattn import ActivationCache, HookedTransformer
from hookedattn.core.kv_cache import KeyValueCache, KeyValueCacheEntry
from hookedattn.core.names import get_act_name


@runtime_checkable
class VariantSources(Protocol):
    """Per-variant sources built when a pass asks for its variants (`source[variants]`:
    `[variant batch ...]`), where holding every variant's at once would cost too much
    (an expert's write: `analysis.patching._experts`)."""

    ndim: int
    device: torch.device

    def __getitem__(self, variants: Tensor | Sequence[int]) -> Tensor: ...


@dataclasses.dataclass(frozen=True)
class Edit:
    """In variant i, replace the region `mask[i]` of activation `kind` of block `layer`
    by `source`: `[batch ...]` (one for every variant) or `[variant batch ...]` (a tensor,
    or `VariantSources`). A mask with a variant axis of size 1 is every variant's. With
    `rows`, `source` is a table `[row batch ...]` and variant i takes its row `rows[i]` (many
    variants, few sources: exact edge patching, where every edge from one sender into one
    hook point shares one). A source axis of size 1 (e.g. the head axis) broadcasts over the
    activation's."""

    kind: str
    layer: int
    mask: Bool[Tensor, "variant 1 ..."]
    source: Tensor | VariantSources
    rows: Int[Tensor, " variant"] | None = None

    @property
    def hook(self) -> str:
        """The full hook name."""
        return get_act_name(self.kind, self.layer)

    @property
    def per_variant(self) -> bool:
        """Whether each variant has its own source."""
        return self.source.ndim == self.mask.ndim

    def source_of(self, variants: Tensor) -> Tensor:
        """The source of `variants`, `[variant batch ...]` (variant axis of size 1 if shared)."""
        if not self.per_variant:
            return self.source[None]
        return self.source[variants if self.rows is None else self.rows[variants]]

    def packed(self, packs: Sequence[Sequence[int]]) -> "Edit":
        """This edit for variants merged into packs: pack j has the union of its members'
        regions (disjoint, or the pack has one member)."""
        if self.mask.shape[0] == 1:
            mask = self.mask.expand(len(packs), *self.mask.shape[1:])
        else:  # each pack's members' masks or-ed together, as one sum over the members
            like = dict(device=self.mask.device)
            members = torch.tensor([m for pack in packs for m in pack], **like)
            pack_of = torch.tensor([j for j, pack in enumerate(packs) for _ in pack], **like)
            hits = torch.zeros((len(packs), *self.mask.shape[1:]), dtype=torch.int32, **like)
            mask = hits.index_add_(0, pack_of, self.mask[members].int()) > 0
        if not self.per_variant:
            return Edit(self.kind, self.layer, mask, self.source)
        assert all(len(members) == 1 for members in packs)
        firsts = [m[0] for m in packs]
        if self.rows is not None:
            return Edit(self.kind, self.layer, mask, self.source, self.rows[firsts])
        return Edit(self.kind, self.layer, mask, self.source[firsts])


def component_edits(components: Sequence[Component], source: ActivationCache) -> list[Edit]:
    """One edit per hook point of `components`: variant i takes component i's region from
    `source`."""
    hooks = {(c.name, c.layer): "" for c in components}  # a name per kind and block, once
    hooks = {key: get_act_name(*key) for key in hooks}
    names = [hooks[c.name, c.layer] for c in components]
    firsts = {name: c for name, c in zip(names, components, strict=True)}
    return [
        Edit(
            c.name, c.layer, masks_at(components, names, name, source[name].shape[1:]), source[name]
        )
        for name, c in firsts.items()
    ]


def extents(edits: Sequence[Edit], n_variants: int, n_pos: int) -> list[Extent | None]:
    """Where each variant's edits lie (None for a variant that no edit touches)."""
    big = n_pos * 1000 + 10**6
    layer = torch.full((n_variants,), big)
    start, window_end = torch.full((n_variants,), big), torch.zeros(n_variants, dtype=torch.long)
    touched_by = []
    for edit in edits:
        mask = edit.mask.cpu().expand(n_variants, *edit.mask.shape[1:])
        pos = 2 + LAYOUTS[edit.kind].index("pos")
        hits = mask.movedim(pos, 1).flatten(2).any(2)  # [variant pos]
        touched = hits.any(1)
        if hits.shape[1] == 1:
            first, end = torch.zeros(n_variants, dtype=torch.long), torch.full((n_variants,), n_pos)
        else:
            first = hits.int().argmax(1)
            end = hits.shape[1] - hits.flip(1).int().argmax(1)
        layer = torch.where(touched, layer.clamp(max=edit.layer), layer)
        start = torch.where(touched, torch.minimum(start, first), start)
        window_end = torch.where(touched, torch.maximum(window_end, end), window_end)
        touched_by.append((edit, touched))
    local = torch.ones(n_variants, dtype=torch.bool)
    for edit, touched in touched_by:
        local &= ~touched | ((layer == edit.layer) & (edit.kind in LOCAL_KINDS))
    columns = (layer, start, window_end, local)
    rows = zip(*(c.tolist() for c in columns), strict=True)
    return [None if row[0] == big else Extent(*row) for row in rows]


def reaches(extent: Extent, declared: Sequence[int], n_layers: int) -> bool:
    """Whether a variant can change the logits at a declared position."""
    if extent.start > declared[-1]:
        return False
    if extent.local and extent.layer == n_layers - 1:
        return any(extent.start <= p < extent.window_end for p in declared)
    return True


def sweep(
    model: HookedTransformer,
    base: BaseRun,
    edits: Sequence[Edit],
    n_variants: int,
    metric: Metric,
    declared: Sequence[int] | None = None,
    memory_budget: int | None = None,
    label: Callable[[int], str] | None = None,
) -> Float[Tensor, "variant batch"]:
    """The metric of every variant of `base` (see the module docstring). `label(i)` names
    variant i in errors."""
    batch, n_pos = base.tokens.shape
    n_layers = model.cfg.n_layers
    budget = check_memory_budget(
        default_memory_budget(model) if memory_budget is None else memory_budget
    )
    found = extents(edits, n_variants, n_pos)
    if declared is not None:
        declared = tuple(declared)
        found = [e if e is not None and reaches(e, declared, n_layers) else None for e in found]
    end = n_pos if declared is None else declared[-1] + 1
    readout = Readout(base, metric, declared, label, budget)
    out = base.metric.repeat(n_variants, 1)
    entering = _packed_blocks(model, base, edits, found, end, budget, readout, out)
    n_unembed = None if declared is None else len(declared)
    cost = pass_cost(model, n_pos, _time_one_pass)
    for p in plan(model, found, batch, end, n_unembed, cost, budget):
        resid, _, last_kv = _run(model, base, edits, p, n_layers, (), entering.get(p.layer))
        if declared is None:
            pieces = pass_pieces(model, p, resid, n_pos)
        else:
            logits = declared_logits(model, base, p, resid, declared)
            if p.again:
                logits = again(model, base, p, last_kv, declared, logits)
            pieces = [(list(declared), logits)]
        out[list(p.variants)] = readout.values(p.variants, pieces)
    return out


def _packed_blocks(
    model: HookedTransformer,
    base: BaseRun,
    edits: Sequence[Edit],
    found: list[Extent | None],
    end: int,
    memory_budget: int,
    readout: Readout,
    out: Float[Tensor, "variant batch"],
) -> dict[int, "_Entering"]:
    """Run every local variant's block packed. Those in the last block are done: their
    metric goes into `out` and their extent in `found` becomes None. The others go on
    from the next block with a non-local change in their window (their new extent in
    `found`); returned: the stream entering that block, by block."""
    n_layers = model.cfg.n_layers
    entering: dict[int, _Entering] = {}
    for layer in sorted({e.layer for e in found if e is not None and e.local}):
        members = [v for v, e in enumerate(found) if e is not None and e.local and e.layer == layer]
        extents_ = [found[v] for v in members]
        packed = _run_packed(model, base, edits, members, extents_, end, memory_budget)
        if layer == n_layers - 1:
            order, pieces = packed.pieces(model, readout.declared)
            done = [members[i] for i in order]
            out[done] = readout.values(done, pieces)
            for v in members:
                found[v] = None  # done
            continue
        entering[layer + 1] = packed.entering(base, members, len(found))
        for v in members:  # from the next block on, a non-local change from its window
            e = found[v]
            found[v] = Extent(layer + 1, e.start, min(e.window_end, end), False)
    return entering


@dataclasses.dataclass(frozen=True)
class _Entering:
    """The residual stream entering a block for variants that a packed pass ran through
    the block before: a variant's window (`window[v]`) from its pack `pack_of[v]`, the
    unpatched stream elsewhere."""

    packs: Float[Tensor, "pack batch pos d_model"]
    pack_of: Int[Tensor, " variant"]
    window: Bool[Tensor, "variant pos"]

    def of(
        self, variants: Sequence[int], unpatched: Float[Tensor, "1 batch row d_model"], p: Pass
    ) -> Float[Tensor, "variant batch row d_model"]:
        """The stream of `variants` at the rows `p` runs (`unpatched` holds those rows)."""
        index = torch.tensor(variants, device=self.packs.device)
        window = self.window.narrow(1, p.n_past, p.rows)[index][:, None, :, None]
        packs = self.packs.narrow(2, p.n_past, p.rows)[self.pack_of[index]]
        return torch.where(window, packs, unpatched)


@dataclasses.dataclass(frozen=True)
class _Packed:
    """The output of one block for packed variants: `resid[j]` is pack j's stream leaving
    the block at positions `start..start+rows-1`; member i is in pack `pack_of[i]`, its
    window at positions `windows[i]`."""

    layer: int
    start: int
    resid: Float[Tensor, "pack batch row d_model"]
    pack_of: tuple[int, ...]
    windows: tuple[tuple[int, int], ...]

    def _window_mask(self, n_pos: int, device: torch.device) -> Bool[Tensor, "member pos"]:
        positions = torch.arange(n_pos, device=device)
        bounds = torch.tensor(self.windows, device=device)
        return (positions >= bounds[:, :1]) & (positions < bounds[:, 1:])

    def entering(self, base: BaseRun, members: Sequence[int], n_variants: int) -> _Entering:
        """The stream entering the next block, for the sweep's variants `members`."""
        unpatched = base.cache[get_act_name("resid_pre", self.layer + 1)]
        full = unpatched[None].repeat(len(self.resid), 1, 1, 1)
        full[:, :, self.start : self.start + self.resid.shape[2]] = self.resid
        n_pos, device = unpatched.shape[1], unpatched.device
        window = torch.zeros(n_variants, n_pos, dtype=torch.bool, device=device)
        window[list(members)] = self._window_mask(n_pos, device)
        pack_of = torch.zeros(n_variants, dtype=torch.long, device=device)
        pack_of[list(members)] = torch.tensor(self.pack_of, device=device)
        return _Entering(full, pack_of, window)

    def pieces(
        self, model: HookedTransformer, declared: Sequence[int] | None
    ) -> tuple[list[int], list[Piece]]:
        """The members' logits after the last block in their windows (with `declared`, at
        the declared positions there): their packs' rows, unembedded, one piece per
        window; and the members (indices into `windows`) in the pieces' order."""
        n_rows = self.resid.shape[2]
        if declared is None:
            wanted = list(range(n_rows))
        else:
            wanted = [q - self.start for q in declared if 0 <= q - self.start < n_rows]
        chosen = rearrange(self.resid[:, :, wanted], "pack b row d -> (pack b) row d")
        with torch.no_grad():
            new = model(chosen, start_at_layer=model.cfg.n_layers)
        new = rearrange(new, "(pack b) row v -> pack b row v", pack=len(self.resid))
        column = {self.start + row: k for k, row in enumerate(wanted)}
        by_window: dict[tuple[int, int], list[int]] = {}
        for i, window in enumerate(self.windows):
            by_window.setdefault(window, []).append(i)
        order, pieces = [], []
        for (begin, stop), members in by_window.items():
            packs = torch.tensor([self.pack_of[i] for i in members], device=new.device)
            if declared is None:
                rows = new[:, :, begin - self.start : stop - self.start]
                pieces.append((slice(begin, stop), rows[packs]))
            else:
                here = [q for q in declared if begin <= q < stop]
                pieces.append((here, new[:, :, [column[q] for q in here]][packs]))
            order += members
        return order, pieces


def _packs(windows: Sequence[tuple[int, int]], shared: bool) -> list[list[int]]:
    """Members (indices into `windows`) in packs of disjoint windows, as few as there can
    be (earliest start first, into the pack that freed soonest); one member a pack where
    the sources are not `shared`."""
    if not shared:
        return [[i] for i in range(len(windows))]
    packs: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (the stop of a pack's last window, the pack)
    for i in sorted(range(len(windows)), key=windows.__getitem__):
        begin, stop = windows[i]
        if free and free[0][0] <= begin:
            j = heapq.heappop(free)[1]
        else:
            j = len(packs)
            packs.append([])
        packs[j].append(i)
        heapq.heappush(free, (stop, j))
    return packs


def _run_packed(
    model: HookedTransformer,
    base: BaseRun,
    edits: Sequence[Edit],
    members: Sequence[int],
    extents_: Sequence[Extent],
    end: int,
    memory_budget: int,
) -> _Packed:
    """Block `layer` of the local variants `members` (of the sweep), in packs, in passes
    within `memory_budget`, over the positions some member's window holds."""
    layer = extents_[0].layer
    windows = [(e.start, min(e.window_end, end)) for e in extents_]
    packs = _packs(windows, shared=not any(e.per_variant for e in edits))
    stop = max(w[1] for w in windows)
    start = 0 if runs_from_the_start(model) else min(w[0] for w in windows)
    cfg = model.cfg
    per_pack = base.tokens.shape[0] * (stop - start) * row_floats(cfg, stop) * itemsize(cfg)
    size = max(1, memory_budget // per_pack)
    outputs = []
    for k in range(0, len(packs), size):
        chunk = [[members[i] for i in pack] for pack in packs[k : k + size]]
        p = Pass(layer, tuple(range(len(chunk))), start, stop - start)
        resid = _run(model, base, [e.packed(chunk) for e in edits], p, layer + 1, ())[0]
        outputs.append(rearrange(resid, "(pack b) row d -> pack b row d", pack=len(chunk)))
    pack_of = [0] * len(members)
    for j, pack in enumerate(packs):
        for i in pack:
            pack_of[i] = j
    return _Packed(layer, start, torch.cat(outputs), tuple(pack_of), tuple(windows))


def _time_one_pass(model: HookedTransformer, n_pos: int) -> float:
    """The best of three times of a whole pass (one variant patching the stream's last
    position, its logits and metric), by `model`'s own sweep."""
    tokens = torch.zeros(1, n_pos, dtype=torch.long, device=model.cfg.device)
    base = base_run(model, tokens, _first_logit, [get_act_name("resid_pre", 0)])
    where = torch.zeros(1, 1, n_pos, 1, dtype=torch.bool)
    where[..., -1, :] = True
    edits = [Edit("resid_pre", 0, where, base.cache[get_act_name("resid_pre", 0)])]
    n_past = 0 if runs_from_the_start(model) else n_pos - 1
    p = Pass(0, (0,), n_past, n_pos - n_past)
    readout = Readout(base, _first_logit, None, None)
    best, now = float("inf"), clock(model.cfg.device)
    for _ in range(3):
        start = now()
        pieces = pass_pieces(model, p, _run(model, base, edits, p, 1, ())[0], n_pos)
        float(readout.values((0,), pieces)[0, 0])  # waits for an accelerator
        best = min(best, now() - start)
    return best


def _first_logit(logits: Float[Tensor, "batch pos d_vocab_out"]) -> Float[Tensor, " batch"]:
    return logits[:, -1, 0]


def record(
    model: HookedTransformer,
    base: BaseRun,
    edits: Sequence[Edit],
    n_variants: int,
    names: Sequence[str],
    stop_layer: int,
    end: int,
    memory_budget: int | None = None,
) -> dict[str, Tensor]:
    """The activations at `names` of positions `..end-1` in every variant of `base`,
    `[variant batch ...]`, from passes that stop before block `stop_layer`."""
    batch = base.tokens.shape[0]
    found = extents(edits, n_variants, base.tokens.shape[1])
    budget = check_memory_budget(
        default_memory_budget(model) if memory_budget is None else memory_budget
    )
    kept = sum(base.cache[n][:1].numel() for n in names)
    per_variant = batch * (end * row_floats(model.cfg, end) + kept) * base.logits.element_size()
    size = max(1, budget // per_variant)
    out: dict[str, list[Tensor]] = {n: [] for n in names}
    for i in range(0, n_variants, size):
        variants = tuple(range(i, min(i + size, n_variants)))
        first = min((found[v].layer for v in variants if found[v] is not None), default=stop_layer)
        p = Pass(first, variants, 0, end)
        recorded = _run(model, base, edits, p, stop_layer, names)[1] if first < stop_layer else {}
        for name in names:  # a hook point before the pass's first block keeps its value
            unpatched = base.cache[name][None].narrow(2, 0, end)
            out[name].append(
                recorded.get(name, unpatched.expand(len(variants), *unpatched.shape[1:]))
            )
    return {name: torch.cat(values) for name, values in out.items()}


def _run(
    model: HookedTransformer,
    base: BaseRun,
    edits: Sequence[Edit],
    p: Pass,
    stop_layer: int,
    names: Sequence[str],
    entering: _Entering | None = None,
) -> tuple[Float[Tensor, "sequence row d_model"], dict[str, Tensor], tuple[Tensor, Tensor]]:
    """Pass `p` from its block to block `stop_layer`: the stream it leaves, the activations
    at `names` (`[variant batch ...]`), with `p.again` the last block's keys and values of
    its rows (`[sequence row ...]`; else empty). The stream entering it is the unpatched
    run's, or `entering`'s."""
    n_variants = len(p.variants)
    variants = torch.tensor(p.variants)
    recorded: dict[str, Tensor] = {}

    def keep(activation: Tensor, hook) -> None:
        recorded[hook.name] = rearrange(activation, "(v b) ... -> v b ...", v=n_variants)

    hooks = [h for e in edits if (h := _edit_hook(e, p, variants)) is not None]
    # With `again`, the last block's keys and values of the rows, as its hook points see
    # them (after any edit; whole under tensor parallelism, where the cache holds a slice).
    last_kv = _last_kv_names(model) if p.again else ()
    hooks += [(name, keep) for name in (*names, *last_kv)]
    past = _past(model, base, p, stop_layer)
    resid = _rows_of(base.cache[get_act_name("resid_pre", p.layer)][None], 2, p)
    if entering is not None:
        resid = entering.of(p.variants, resid, p)
    resid = rearrange(resid.expand(n_variants, -1, -1, -1), "v b row d -> (v b) row d")
    # A view of some rows would make every projection a broadcast batched matmul.
    resid = resid.contiguous()
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        resid = model(resid, start_at_layer=p.layer, stop_at_layer=stop_layer, past_kv_cache=past)
    if not p.again:
        return resid, recorded, (resid[:0], resid[:0])
    keys, values = (
        rearrange(recorded.pop(name), "v b row h d -> (v b) row h d") for name in last_kv
    )
    return resid, recorded, (keys, values)


def _last_kv_names(model: HookedTransformer) -> tuple[str, str]:
    """The hook points whose values the last block's KV cache holds."""
    last = model.cfg.n_layers - 1
    return key_name(model, last), value_name(model, last)


def _rows_of(x: Tensor, axis: int, p: Pass) -> Tensor:
    """The rows `p` runs along `axis` of `x`; an axis of size 1 broadcasts."""
    return x if x.shape[axis] == 1 else x.narrow(axis, p.n_past, p.rows)


def _edit_hook(edit: Edit, p: Pass, variants: Tensor) -> tuple[str, Callable] | None:
    """A hook applying `edit` to the variants of `p`, or None where it touches none of them
    (or lies in a block before the pass's first)."""
    if edit.layer < p.layer:
        return None
    mask = (edit.mask[variants] if edit.mask.shape[0] > 1 else edit.mask).to(edit.source.device)
    if not bool(mask.any()):
        return None
    source = edit.source_of(variants.to(edit.source.device))
    layout = LAYOUTS[edit.kind]
    pos = 2 + layout.index("pos")
    mask, source = (_rows_of(x, pos, p) for x in (mask, source))
    if "key_pos" in layout:  # keys are the past ones, then the rows
        key = 2 + layout.index("key_pos")
        mask, source = (
            x if x.shape[key] == 1 else x.narrow(key, 0, p.n_past + p.rows) for x in (mask, source)
        )
    n_variants = len(p.variants)

    def patch(activation: Tensor, hook) -> Tensor:
        by_variant = rearrange(activation, "(v b) ... -> v b ...", v=n_variants)
        return rearrange(torch.where(mask, source, by_variant), "v b ... -> (v b) ...")

    return edit.hook, patch


def _past(
    model: HookedTransformer,
    base: BaseRun,
    p: Pass,
    stop_layer: int,
) -> KeyValueCache | None:
    """The unpatched keys and values of positions `..p.n_past-1` in the blocks `p` runs,
    for every sequence of the pass."""
    if p.n_past == 0:
        return None
    n_variants, batch = len(p.variants), base.tokens.shape[0]
    entries = {}
    for layer in range(p.layer, stop_layer):
        keys, values = (
            repeat(base.cache[name][:, : p.n_past], "b pos h d -> (v b) pos h d", v=n_variants)
            for name in (key_name(model, layer), value_name(model, layer))
        )
        entries[layer] = KeyValueCacheEntry(keys, values, frozen=True)
    # Blocks the pass does not run take any entry: they never read it.
    filled = [
        entries[min(max(layer, p.layer), stop_layer - 1)] for layer in range(model.cfg.n_layers)
    ]
    mask = torch.ones(n_variants * batch, p.n_past, dtype=torch.long, device=base.tokens.device)
    return KeyValueCache(filled, mask, frozen=True)
