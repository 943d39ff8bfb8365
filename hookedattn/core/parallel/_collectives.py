"""The three collectives a tensor-parallel forward needs, each differentiable.

Megatron-LM's pair (Shoeybi et al. 2019, section 3): a replicated activation enters a
sharded product through `replicated_input` (the identity; backwards, the ranks' partial
gradients are summed), and the sharded product's partial results leave through
`sum_partials` (summed over the ranks; backwards, the identity). `gather` concatenates each
rank's part of an axis (the logits' vocabulary, a hook point's heads); backwards each rank
keeps its own part of the gradient.

They run `torch.distributed`'s collectives on the mesh's process group (gloo or NCCL)
directly: DTensor's `redistribute` does the same transfers with more work per call, which
a forward would pay twice per block (measured in docs/guide/distributed.md).

Under `torch.no_grad()` (patching, generation, caching) no autograd node is built.
"""

import torch
import torch.distributed as dist
from torch import Tensor

from hookedattn.core.parallel._group import TensorParallelGroup


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
        return _Gathered.apply(x, axis, size, group, False)
    return gathered(x, axis, size, group)


def gather_for_hooks(x: Tensor, axis: int, size: int, group: TensorParallelGroup) -> Tensor:
    """`gather`, for hooks that may move values between the ranks' parts: backwards, the
    gradients of the whole are summed over the ranks before each keeps its own part."""
    if x.requires_grad and torch.is_grad_enabled():
        return _Gathered.apply(x, axis, size, group, True)
    return gathered(x, axis, size, group)


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
    def forward(
        ctx, x: Tensor, axis: int, size: int, group: TensorParallelGroup, sum_first: bool
    ) -> Tensor:
        ctx.axis, ctx.group, ctx.sum_first = axis % x.ndim, group, sum_first
        ctx.start, ctx.length = sum(group.lengths(size)[: group.rank]), x.shape[ctx.axis]
        return gathered(x, axis, size, group)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        if ctx.sum_first:
            grad = _all_reduce(grad.clone(), ctx.group)
        return grad.narrow(ctx.axis, ctx.start, ctx.length).contiguous(), None, None, None, None
