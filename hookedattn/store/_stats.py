"""Per-feature mean and variance of each stored activation, for normalising SAE or probe inputs.

The writer keeps each shard's moments (count, mean, M2, in float64, of the activations as
the model computed them, before the cast to the store dtype) in the shard itself; the store's
moments combine them in shard order, so they are the same however many ranks wrote the
shards. `stats.safetensors` holds the combined result of a complete store.
"""

import dataclasses
from pathlib import Path

import safetensors
import safetensors.torch
import torch
from jaxtyping import Float
from torch import Tensor

from hookedattn.store._manifest import (
    STATS_PREFIX,
    ShardSpec,
    commit,
    file_metadata,
    read_file_metadata,
    temporary_name,
)
from hookedattn.store._writer import RunningMoments

STATS_FILE = "stats.safetensors"


@dataclasses.dataclass(frozen=True)
class RunningStats:
    """`count` rows; their per-feature `mean` and (population) `var`, float64."""

    count: int
    mean: Float[Tensor, "*feature"]
    var: Float[Tensor, "*feature"]

    @property
    def std(self) -> Float[Tensor, "*feature"]:
        """The per-feature standard deviation."""
        return self.var.sqrt()


def shard_moments(paths: list[Path], names: list[str]) -> dict[str, RunningMoments]:
    """The moments of each name over the shards at `paths`, combined in the order given."""
    empty = torch.zeros((), dtype=torch.float64)
    combined = {name: RunningMoments(0, empty, empty) for name in names}
    for path in paths:
        with safetensors.safe_open(str(path), framework="pt") as f:
            for name in names:
                mean = f.get_tensor(f"{STATS_PREFIX}{name}.mean")
                m2 = f.get_tensor(f"{STATS_PREFIX}{name}.m2")
                rows = f.get_slice(name).get_shape()[0]
                combined[name] = combined[name].combine(RunningMoments(rows, mean, m2))
    return combined


def as_stats(moments: RunningMoments) -> RunningStats:
    """Mean and variance from count, mean and M2."""
    return RunningStats(moments.count, moments.mean, moments.m2 / max(moments.count, 1))


def write_stats(out: Path, shards: list[ShardSpec], names: list[str]) -> int:
    """Write the combined moments of every shard to `stats.safetensors`; its size in bytes."""
    moments = shard_moments([out / s.file for s in shards], names)
    tensors = {}
    for name, m in moments.items():
        tensors[f"{name}.mean"], tensors[f"{name}.var"] = m.mean, m.m2 / m.count
    metadata = file_metadata({"counts": {name: m.count for name, m in moments.items()}})
    final = out / STATS_FILE
    tmp = temporary_name(final)
    try:
        safetensors.torch.save_file(tensors, str(tmp), metadata=metadata)
        commit(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final.stat().st_size


def read_stats(out: Path, name: str) -> RunningStats:
    """The stats of `name` from a complete store's `stats.safetensors`."""
    with safetensors.safe_open(str(out / STATS_FILE), framework="pt") as f:
        count = read_file_metadata(f.metadata())["counts"][name]
        return RunningStats(count, f.get_tensor(f"{name}.mean"), f.get_tensor(f"{name}.var"))
