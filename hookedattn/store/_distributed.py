"""Ranks under `torchrun`: which share of the work is this process's, and waiting for the others.

Nothing here schedules anything: `torchrun` (one node or `--nnodes`) starts the processes
and sets `RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT`; `init_from_env` joins the
process group they describe (gloo on CPU, NCCL when the model is on a GPU). Without those
variables everything runs as rank 0 of 1.
"""

import dataclasses
import os
from typing import Any

import torch
import torch.distributed as dist


@dataclasses.dataclass(frozen=True)
class RankInfo:
    """This process's `rank` among `world_size`."""

    rank: int
    world_size: int

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0, the one that writes shared files."""
        return self.rank == 0

    def share(self, n_items: int) -> range:
        """The items this rank takes: every `world_size`-th, starting at its rank."""
        return range(self.rank, n_items, self.world_size)


def current_rank() -> RankInfo:
    """The rank of this process in the default process group (0 of 1 without one)."""
    if dist.is_available() and dist.is_initialized():
        return RankInfo(dist.get_rank(), dist.get_world_size())
    return RankInfo(0, 1)


def init_from_env(backend: str | None = None) -> RankInfo:
    """Join the process group `torchrun` describes in the environment, if there is one.

    `backend` defaults to NCCL when CUDA is available and gloo otherwise. A process that is
    already in a group, or that was not started by a launcher (no `WORLD_SIZE`), stays as it is.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size > 1 and not dist.is_initialized():
        if backend is None:
            backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":  # NCCL's collectives run on this rank's own GPU
            torch.cuda.set_device(local_device_index())
        dist.init_process_group(backend)
    return current_rank()


def local_device_index() -> int:
    """This process's index among the ranks on its node (`LOCAL_RANK`), e.g. its GPU."""
    return int(os.environ.get("LOCAL_RANK", "0"))


def barrier() -> None:
    """Wait for every rank (nothing to wait for with one process)."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def from_main(value: Any) -> Any:
    """Rank 0's `value` (any picklable object) on every rank; `value` itself without a
    process group. Every rank must call it."""
    if not (dist.is_available() and dist.is_initialized()):
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
