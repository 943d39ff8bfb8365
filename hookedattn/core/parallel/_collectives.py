"""The four collectives a tensor-parallel forward needs, each differentiable, each with
its adjoint as its backward.

Megatron-LM's pair (Shoeybi et al. 2019, section 3): a replicated activation enters a
sharded product through `replicated_input` (the identity; backwards, the ranks' partial
gradients are summed), and the sharded product's partial results leave through
`sum_partials` (summed over the ranks; backwards, the identity). `gather` concatenates each
rank's part of an axis (the logits' vocabulary, a hook point's heads); backwards each rank
keeps its own part of the gradient. `own_part` is its mirror (Megatron's scatter): a whole
tensor, the same on every rank, cut to this rank's part; backwards the ranks' parts of the
gradient are gathered, so that the whole has its whole gradient on every rank.

Each backward is right because the gradients reaching a replicated tensor are the same on
every rank: what follows it is computed alike on every rank, or its sharded uses leave
through `sum_partials` or `gather`. A hook point's hooks run on a whole activation between
a `gather` and an `own_part` (`ShardedHookPoint`), so a tensor a hook adds there (the zero
leaf of `analysis`'s metric gradients) gets the one-process gradient on every rank.

They run `torch.distributed`'s collectives on the mesh's process group (gloo or NCCL)
directly: DTensor's `redistribute` does the same transfers with more work per call, which
a forward would pay twice per block (measured in docs/guide/distributed.md).

Under `torch.no_grad()` (patching, generation, caching) no autograd node is built.
"""

import torch
import torch.distributed as dist
from torch import Tensor

from hookedattn.core.parallel._group import TensorParallelGroup
from hookedattn.core.parallel._shards import LocalSlice


def sum_partials(x: Tensor, group: TensorParallelGroup) -> Tensor:
    """The sum over the ranks of each rank's partial `x` (a new tensor, the same on every
    rank); backwards, the identity."""
    if x.requires_grad and torch.is_grad_enabled():
        return _SumPartials.apply(x, group)
    return _all_reduce(x, group)


def replicated_input(x: Tensor, group: TensorParallelGroup) -> Tensor:
    """`x` itself, entering a sharded computation; backwards, the ranks' gradients summed."""
    if x.requires_grad and torch.is_grad_enabled():
        return _ReplicatedInput.apply(x, group)
    return x


def gather(x: Tensor, axis: int, size: int, group: TensorParallelGroup) -> Tensor:
    """Every rank's part of `axis` (an axis of `size` cut as `chunk_range` cuts it),
    concatenated in rank order: the same tensor on every rank. Backwards, each rank keeps
    the gradient of its own part (right where what follows the gather is the same on
    every rank, as the logits are)."""
    if x.requires_grad and torch.is_grad_enabled():
        return _Gathered.apply(x, axis, size, group)
    return gathered(x, axis, size, group)


def own_part(whole: Tensor, part: LocalSlice, group: TensorParallelGroup) -> Tensor:
    """This rank's `part` of `whole` (a tensor the same on every rank), a new tensor;
    backwards, every rank's part of the gradient gathered into the whole's gradient."""
    if whole.requires_grad and torch.is_grad_enabled():
        return _OwnPart.apply(whole, part, group)
    return whole.narrow(part.axis, part.start, part.length).contiguous()


def gathered(x: Tensor, axis: int, size: int, group: TensorParallelGroup) -> Tensor:
    """`gather` without autograd: one all-gather of parts padded to the longest."""
    axis = axis % x.ndim
    lengths = group.lengths(size)
    longest = lengths[0]  # `chunk_range` gives the first rank a longest part
    part = x.contiguous()
    if part.shape[axis] < longest:  # an all-gather moves equal parts: pad, then cut
        pad = list(part.shape)
        pad[axis] = longest - part.shape[axis]
        part = torch.cat([part, part.new_zeros(pad)], dim=axis)
    out = part.new_empty((group.size * part.shape[0], *part.shape[1:]))
    dist.all_gather_into_tensor(out, part, group=group.process_group)
    out = out.view(group.size, *part.shape)  # (rank n) ... -> rank n ...
    if axis == 0 and longest * group.size == size:
        return out.flatten(0, 1)  # rank n ... -> (rank n) ..., a view
    return torch.cat([out[r].narrow(axis, 0, n) for r, n in enumerate(lengths)], dim=axis)


def _all_reduce(x: Tensor, group: TensorParallelGroup) -> Tensor:
    out = x.contiguous()
    if out.data_ptr() == x.data_ptr() and out._base is not None:
        out = out.clone()  # never reduce into a view of someone else's tensor
    dist.all_reduce(out, group=group.process_group)
    return out


class _SumPartials(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group: TensorParallelGroup) -> Tensor:
        return _all_reduce(x.clone(), group)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return grad, None


class _ReplicatedInput(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, group: TensorParallelGroup) -> Tensor:
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        return _all_reduce(grad.clone(), ctx.group), None


class _Gathered(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, axis: int, size: int, group: TensorParallelGroup) -> Tensor:
        ctx.axis = axis % x.ndim
        ctx.start, ctx.length = sum(group.lengths(size)[: group.rank]), x.shape[ctx.axis]
        return gathered(x, axis, size, group)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        return grad.narrow(ctx.axis, ctx.start, ctx.length).contiguous(), None, None, None


class _OwnPart(torch.autograd.Function):
    @staticmethod
    def forward(ctx, whole: Tensor, part: LocalSlice, group: TensorParallelGroup) -> Tensor:
        ctx.part, ctx.group = part, group
        return whole.narrow(part.axis, part.start, part.length).contiguous()

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:
        part = ctx.part
        return gathered(grad.contiguous(), part.axis, part.size, ctx.group), None, None
