"""Per-feature mean and variance of each stored activation, for normalising SAE or probe inputs.

The writer keeps each shard's moments (count, mean, M2, in float64, of the activations as
the model computed them, before the cast to the store dtype) in the shard itself; the store's
moments combine them in shard order, so they are the same however many ranks wrote the
shards. `stats.safetensors` holds the combined result of a complete store; the manifest
records its SHA-256, checked whenever it is read (it is small: two floats per feature).
"""

import dataclasses
import json
from pathlib import Path

import safetensors.torch
import torch
from jaxtyping import Float
from torch import Tensor

from hookedattn.store._files import (
    bytes_sha256,
    commit,
    file_metadata,
    read_file_metadata,
    temporary_name,
)
from hookedattn.store._manifest import STATS_PREFIX, StoreError
from hookedattn.store._shard_file import MappedShard
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


def shard_moments(shards: list[MappedShard], names: list[str]) -> dict[str, RunningMoments]:
    """The moments of each name over `shards` (checked, mapped), combined in the order given."""
    empty = torch.zeros((), dtype=torch.float64)
    combined = {name: RunningMoments(0, empty, empty) for name in names}
    for shard in shards:
        for name in names:
            mean = shard.tensor(f"{STATS_PREFIX}{name}.mean")
            m2 = shard.tensor(f"{STATS_PREFIX}{name}.m2")
            rows = shard.layout[name].shape[0]
            combined[name] = combined[name].combine(RunningMoments(rows, mean, m2))
    return combined


def as_stats(moments: RunningMoments) -> RunningStats:
    """Mean and variance from count, mean and M2."""
    return RunningStats(moments.count, moments.mean, moments.m2 / max(moments.count, 1))


def write_stats(out: Path, shards: list[MappedShard], names: list[str]) -> tuple[int, str]:
    """Write the combined moments of every shard to `stats.safetensors`; its size in bytes
    and its SHA-256."""
    moments = shard_moments(shards, names)
    tensors = {}
    for name, m in moments.items():
        tensors[f"{name}.mean"], tensors[f"{name}.var"] = m.mean, m.m2 / m.count
    metadata = file_metadata({"counts": {name: m.count for name, m in moments.items()}})
    final = out / STATS_FILE
    tmp = temporary_name(final)
    try:
        safetensors.torch.save_file(tensors, str(tmp), metadata=metadata)
        digest = bytes_sha256(tmp.read_bytes())
        commit(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final.stat().st_size, digest


def read_stats(out: Path, name: str, manifest: dict, n_rows: int) -> RunningStats:
    """The stats of `name` from a complete store's `stats.safetensors`, whose bytes must be
    the ones the manifest recorded and whose count must be the store's `n_rows`."""
    path = out / STATS_FILE
    remedy = "rerun the same collect_activations call, which writes it again"
    if not path.is_file():
        raise StoreError(f"{path} is missing from the complete store {out}; {remedy}")
    data = path.read_bytes() if path.stat().st_size == manifest["stats_bytes"] else b""
    if bytes_sha256(data) != manifest["stats_sha256"]:
        raise StoreError(
            f"{path} is damaged: its bytes are not the ones the manifest recorded "
            f"({manifest['stats_bytes']:,} bytes, SHA-256 {manifest['stats_sha256'][:12]}); "
            f"{remedy}"
        )
    tensors = safetensors.torch.load(data)  # the verified bytes, parsed from memory
    n_header = int.from_bytes(data[:8], "little")
    record = read_file_metadata(json.loads(data[8 : 8 + n_header]).get("__metadata__"))
    count = record.get("counts", {}).get(name)
    if count != n_rows:
        raise StoreError(f"{path} counts {count!r} rows of {name}, the store holds {n_rows}")
    return RunningStats(count, tensors[f"{name}.mean"], tensors[f"{name}.var"])
