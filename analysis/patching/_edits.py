"""What a patched variant changes: `Edit`, a region of one activation replaced in each
variant (`component_edits`: one per hook point of a list of components), and where each
variant's edits lie (`extents`), which decides how a sweep runs it (`_sweep`).
"""

import dataclasses
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import torch
from jaxtyping import Bool, Int
from torch import Tensor

from analysis.patching._components import LAYOUTS, LOCAL_KINDS, Component, masks_at
from analysis.patching._plan import (
    Extent,
)
from hookedattn import ActivationCache
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
