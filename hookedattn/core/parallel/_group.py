"""The ranks a tensor-parallel model is split over: a one-dimensional `DeviceMesh`.

`torchrun` starts the processes and describes the job in their environment (`RANK`,
`WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`); `tensor_parallel_group` joins it
through `torch.distributed.device_mesh.init_device_mesh` (gloo for a CPU model, NCCL for a
CUDA one, each rank on GPU `LOCAL_RANK`). Every rank runs the same program: the same model,
the same inputs, the same hooks, in the same order. A collective that one rank reaches and
another does not waits forever, so nothing here may depend on which rank it runs on except
which slice of the weights it holds.
"""

import dataclasses
import os
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from hookedattn.core.parallel._shards import LocalSlice, chunk_lengths, local_slice


@dataclasses.dataclass(frozen=True, eq=False)
class TensorParallelGroup:
    """A tensor-parallel model's ranks: `mesh` (one dimension, named "tp") and this rank's
    place in it. Shared, never copied: a deep copy of a model keeps the same group."""

    mesh: DeviceMesh

    @property
    def rank(self) -> int:
        """This process's rank in the mesh."""
        return self.mesh.get_local_rank()

    @property
    def size(self) -> int:
        """How many ranks the model is split over."""
        return self.mesh.size()

    @property
    def process_group(self) -> Any:
        """The `torch.distributed` process group the collectives run in."""
        return self.mesh.get_group()

    def slice_of(self, size: int, axis: int) -> LocalSlice:
        """This rank's part of an axis of `size` at `axis`."""
        return local_slice(size, axis, self.rank, self.size)

    def lengths(self, size: int) -> list[int]:
        """Every rank's part of an axis of `size`, in rank order."""
        return chunk_lengths(size, self.size)

    def barrier(self) -> None:
        """Wait for every rank of the group."""
        dist.barrier(group=self.process_group)

    def __deepcopy__(self, memo: dict) -> "TensorParallelGroup":
        return self

    def __repr__(self) -> str:
        return f"TensorParallelGroup(rank={self.rank}, size={self.size}, {self.mesh.device_type})"


def tensor_parallel_group(tp_size: int, device: str | torch.device = "cpu") -> TensorParallelGroup:
    """Join the `torchrun` job this process belongs to, as one of `tp_size` ranks.

    `device` is where the model's weights go; its type chooses the mesh (gloo on "cpu",
    NCCL on "cuda"). The job must have exactly `tp_size` processes: a `ValueError` says
    so outside a `torchrun` job, or when `WORLD_SIZE` differs.
    """
    world = _world_size()
    if world is None:
        raise ValueError(
            f"tp_size={tp_size} needs a job of {tp_size} processes started by torchrun "
            f"(torchrun --nproc_per_node {tp_size} script.py); this process was not "
            f"started by one (no WORLD_SIZE in its environment)"
        )
    if world != tp_size:
        raise ValueError(
            f"tp_size={tp_size} but the job has {world} processes (WORLD_SIZE={world}): "
            f"the model is split over every process of the job; pass tp_size={world}, or "
            f"start {tp_size} processes"
        )
    device_type = torch.device(device).type
    if device_type == "cuda":  # NCCL's collectives run on this rank's own GPU
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    mesh = init_device_mesh(device_type, (tp_size,), mesh_dim_names=("tp",))
    return TensorParallelGroup(mesh)


def rank_device(device: str | None, group_device_type: str | None = None) -> str:
    """The device a rank's weights go to: "cpu", or this rank's GPU (`cuda:LOCAL_RANK`)
    when `device` is "cuda" (or None, on a machine with CUDA)."""
    if device is None:
        device = group_device_type or ("cuda" if torch.cuda.is_available() else "cpu")
    parsed = torch.device(device)
    if parsed.type == "cuda" and parsed.index is None:
        return f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}"
    return str(parsed)


def _world_size() -> int | None:
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    world = os.environ.get("WORLD_SIZE")
    return None if world is None else int(world)


def same_on_every_rank(model: Any, value: Any) -> Any:
    """For a tensor-parallel `model`, `value` as its rank 0 has it (broadcast over the
    model's ranks); for any other model, `value` itself.

    For a decision made from a measurement (a time, the free memory): the ranks would
    measure different numbers, decide differently, and then run different collectives.
    """
    group = getattr(model, "tp", None)
    if not isinstance(group, TensorParallelGroup):
        return value
    box = [value]
    dist.broadcast_object_list(box, group_src=0, group=group.process_group)
    return box[0]
