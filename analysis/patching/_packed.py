"""Packed passes: variants whose edits all lie after where their block mixes positions (a
head's output, an MLP, ...: `LOCAL_KINDS`) change that block's output at their own
positions only, so variants of one block with disjoint windows share one sequence
(`packed_blocks`). One pass gives all of them the block's output: their logits after the
last block; else each goes on from the next block with its window of the pack.
"""

import dataclasses
import heapq
from collections.abc import Sequence

import torch
from einops import rearrange
from jaxtyping import Bool, Float
from torch import Tensor

from analysis.patching import _passes
from analysis.patching._edits import Edit
from analysis.patching._inputs import BaseRun
from analysis.patching._passes import Entering
from analysis.patching._plan import (
    Extent,
    Pass,
    itemsize,
    row_floats,
    runs_from_the_start,
)
from analysis.patching._readout import Piece, Readout
from hookedattn import HookedTransformer
from hookedattn.core.names import get_act_name


def packed_blocks(
    model: HookedTransformer,
    base: BaseRun,
    edits: Sequence[Edit],
    found: list[Extent | None],
    end: int,
    memory_budget: int,
    readout: Readout,
    out: Float[Tensor, "variant batch"],
) -> dict[int, Entering]:
    """Run every local variant's block packed. Those in the last block are done: their
    metric goes into `out` and their extent in `found` becomes None. The others go on
    from the next block with a non-local change in their window (their new extent in
    `found`); returned: the stream entering that block, by block."""
    n_layers = model.cfg.n_layers
    entering: dict[int, Entering] = {}
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

    def entering(self, base: BaseRun, members: Sequence[int], n_variants: int) -> Entering:
        """The stream entering the next block, for the sweep's variants `members`."""
        unpatched = base.cache[get_act_name("resid_pre", self.layer + 1)]
        full = unpatched[None].repeat(len(self.resid), 1, 1, 1)
        full[:, :, self.start : self.start + self.resid.shape[2]] = self.resid
        n_pos, device = unpatched.shape[1], unpatched.device
        window = torch.zeros(n_variants, n_pos, dtype=torch.bool, device=device)
        window[list(members)] = self._window_mask(n_pos, device)
        pack_of = torch.zeros(n_variants, dtype=torch.long, device=device)
        pack_of[list(members)] = torch.tensor(self.pack_of, device=device)
        return Entering(full, pack_of, window)

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
        resid = _passes.run(model, base, [e.packed(chunk) for e in edits], p, layer + 1, ())[0]
        outputs.append(rearrange(resid, "(pack b) row d -> pack b row d", pack=len(chunk)))
    pack_of = [0] * len(members)
    for j, pack in enumerate(packs):
        for i in pack:
            pack_of[i] = j
    return _Packed(layer, start, torch.cat(outputs), tuple(pack_of), tuple(windows))
