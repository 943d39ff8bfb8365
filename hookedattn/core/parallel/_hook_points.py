"""Hook points of sharded activations: each rank computes its own heads (or neurons), and a
hook or the cache sees the whole activation, gathered only where something reads it.

A `ShardedHookPoint` is a `HookPoint` whose activation on this rank is a slice (its
`local_slice`) of the one-process activation. Idle, it is what every hook point is: one
attribute test. With a forward hook attached (caching included), it gathers the ranks'
slices into the whole activation, runs the hooks on that, and continues with this rank's
slice of what they return or edited in place: a hook on `hook_z` sees every head, and an
edit of head 5 acts on the rank that holds head 5. A backward hook sees the whole gradient.

Inside `local_activations(model)` nothing is gathered: hooks and the cache see this rank's
slice only (`hook.local_slice` says which), with no communication at all.
"""

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from hookedattn.core.hook_points import HookPoint, _current_thread, _GradientHook
from hookedattn.core.parallel import _collectives
from hookedattn.core.parallel._group import TensorParallelGroup
from hookedattn.core.parallel._shards import LocalSlice


class ShardedHookPoint(HookPoint):
    """A hook point whose activation is sharded over a tensor-parallel group along
    `local_slice.axis`; hooks see the whole activation (module docstring).

    A point that sees activations of two kinds (a block's `ln1` normalises per-head copies
    for the queries, and, with grouped keys, fewer for the keys and values) has one slice
    per kind in `alternatives`, told apart by this rank's length of the axis.
    """

    def __init__(
        self,
        group: TensorParallelGroup,
        local_slice: LocalSlice,
        alternatives: tuple[LocalSlice, ...] = (),
    ) -> None:
        super().__init__()
        self.group = group
        self.local_slice = local_slice
        self.alternatives = (local_slice, *alternatives)
        self.gathering = True

    def slice_of(self, x: Tensor) -> LocalSlice:
        """The slice that this rank's activation `x` is."""
        for part in self.alternatives:
            if x.shape[part.axis] == part.length:
                return part
        raise ValueError(
            f"{self.name} holds {x.shape[self.local_slice.axis]} of axis "
            f"{self.local_slice.axis} on this rank; expected "
            f"{' or '.join(str(p.length) for p in self.alternatives)}"
        )

    def _run_forward_hooks(self, x: Tensor) -> Tensor:
        if not self.gathering:
            return super()._run_forward_hooks(x)
        part = self.slice_of(x)
        whole = _collectives.gather(x, part.axis, part.size, self.group)
        # An inference tensor keeps no version counter: an edit in place cannot be told
        # from a read, so its slice is taken again (a copy) either way.
        version = None if whole.is_inference() else whole._version
        out = super()._run_forward_hooks(whole)
        if out is whole and version is not None and whole._version == version:
            return x  # read, not edited: this rank's slice is the one it had
        # Backwards, the ranks' parts are gathered: what the hooks made (a leaf added, an
        # edit) gets the whole gradient on every rank, as in one process.
        return _collectives.own_part(out, part, self.group)

    def _attach_backward_hooks(self, x: Tensor) -> Tensor:
        if not self.gathering:
            return super()._attach_backward_hooks(x)
        thread = _current_thread()
        for handle in self._bwd:
            self._check_thread(handle, thread)
        return _WholeGradient.apply(x, self, self.slice_of(x), tuple(self._bwd))

    def extra_repr(self) -> str:
        part = self.local_slice
        return f"{super().extra_repr()}, axis={part.axis}, local={part.start}..{part.stop - 1}"


class _WholeGradient(torch.autograd.Function):
    """The identity; backwards, the backward hooks of a sharded point run on the whole
    gradient (gathered), and this rank keeps its slice of what they return."""

    @staticmethod
    def forward(
        ctx, x: Tensor, point: ShardedHookPoint, part: LocalSlice, handles: tuple
    ) -> Tensor:
        ctx.point, ctx.part, ctx.handles = point, part, handles
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        point, part = ctx.point, ctx.part
        whole = _collectives.gathered(grad.contiguous(), part.axis, part.size, point.group)
        for handle in ctx.handles:
            out = _GradientHook(handle.fn, point)(whole)
            if out is not None:
                whole = out
        return whole.narrow(part.axis, part.start, part.length).contiguous(), None, None, None


def sharded_hook_points(model: Any) -> list[ShardedHookPoint]:
    """The model's hook points whose activations are sharded (none in one process)."""
    return [m for m in model.modules() if isinstance(m, ShardedHookPoint)]


@contextlib.contextmanager
def local_activations(model: Any) -> Iterator[Any]:
    """Within this scope, hooks and caches of `model` see each rank's own slice of every
    sharded activation (its heads or neurons; `model.hook_dict[name].local_slice` says
    which), and nothing is gathered: a cached run costs no communication beyond the
    forward's own. Outside it, they see whole activations again."""
    points = sharded_hook_points(model)
    before = [p.gathering for p in points]
    for point in points:
        point.gathering = False
    try:
        yield model
    finally:
        for point, gathering in zip(points, before, strict=True):
            point.gathering = gathering
