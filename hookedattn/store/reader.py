"""`ActivationStore`: a collected store, memory-mapped, read by row or in shuffled batches.

Nothing is loaded when a store is opened: each shard is mapped (`mmap`) the first time a
row of it is read, and rows are gathered straight from the page cache. Rows are numbered
store-wide in shard order (context after context, position after position), so row
`i` of every name comes from the same token, `tokens(i)`.

A store whose manifest says `"writing"` (a collection in progress, or one that stopped)
shows only the shards already committed: a shard file appears under its final name only
once it is whole. Its rows are numbered over those shards; `origin` gives each row's
context in the packed inputs either way.
"""

import dataclasses
import json
import mmap
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.utils.data
from jaxtyping import Int
from torch import Tensor

from hookedattn.core.names import unknown_name_message
from hookedattn.store._manifest import (
    ShardSpec,
    StoreError,
    read_file_metadata,
    read_manifest,
    weights_differ,
)
from hookedattn.store._stats import RunningStats, as_stats, read_stats, shard_moments

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
}


class _MappedShard:
    """One shard file, mapped copy-on-write, its tensors read in place (safetensors layout)."""

    def __init__(self, path: Path, fingerprint: str) -> None:
        self.path = path
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            f.seek(0)
            prefix = f.read(8)
            if len(prefix) < 8:
                raise StoreError(f"shard {path} is truncated: {size} bytes, not even a header")
            (header_len,) = struct.unpack("<Q", prefix)
            try:
                self.header = json.loads(f.read(header_len))
            except (json.JSONDecodeError, UnicodeDecodeError) as error:
                raise StoreError(f"shard {path} has a damaged header ({error})") from error
            # Copy-on-write: torch wants a writable buffer; nothing is ever written back.
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        self.data_start = 8 + header_len
        metadata = read_file_metadata(self.header.pop("__metadata__", {}))
        end = max(info["data_offsets"][1] for info in self.header.values())
        if size != self.data_start + end:
            raise StoreError(
                f"shard {path} is truncated or damaged: {size:,} bytes, its "
                f"header describes {self.data_start + end:,}"
            )
        if metadata.get("fingerprint") != fingerprint:
            raise StoreError(
                f"shard {path} belongs to another collection (fingerprint "
                f"{metadata.get('fingerprint')!r}, manifest {fingerprint!r})"
            )
        self._tensors: dict[str, Tensor] = {}

    def tensor(self, key: str) -> Tensor:
        """The tensor `key`, a view of the mapped file."""
        if key not in self._tensors:
            info = self.header[key]
            dtype, shape = _DTYPES[info["dtype"]], info["shape"]
            begin, _ = info["data_offsets"]
            count = 1
            for size in shape:
                count *= size
            flat = torch.frombuffer(
                self.map, dtype=dtype, count=count, offset=self.data_start + begin
            )
            self._tensors[key] = flat.reshape(shape)
        return self._tensors[key]


@dataclasses.dataclass(frozen=True)
class RowOrigin:
    """Where rows come from: the `context` index (in the packed inputs), the `position` in
    it, and the `token` there."""

    context: Int[Tensor, " row"]
    position: Int[Tensor, " row"]
    token: Int[Tensor, " row"]


class ActivationStore:
    """The store in folder `path`; with `model`, refused unless written by the same weights."""

    def __init__(self, path: str | Path, model: Any = None) -> None:
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        self.complete = self.manifest.get("status") == "complete"
        self.fingerprint = self.manifest["fingerprint"]
        self.names: list[str] = list(self.manifest["names"])
        self.rows_per_context: int = self.manifest["rows_per_context"]
        listed = self.manifest["shards"]
        self.n_shards_planned = len(listed)
        specs = [ShardSpec(r["index"], *r["contexts"], self.rows_per_context) for r in listed]
        self._shards = [s for s, r in zip(specs, listed, strict=True) if self._present(s, r)]
        ends = torch.tensor([s.rows[1] - s.rows[0] for s in self._shards], dtype=torch.long)
        self._ends = ends.cumsum(0)
        self._starts = self._ends - ends
        self._maps: dict[int, _MappedShard] = {}
        if model is not None:
            self.check_model(model)

    def _present(self, spec: ShardSpec, record: dict) -> bool:
        path = self.path / spec.file
        if not self.complete:
            return path.is_file()  # committed by rename, so whole
        if not path.is_file():
            raise StoreError(
                f"shard {spec.file} of the complete store {self.path} is missing "
                f"(it held contexts {spec.start}..{spec.stop})"
            )
        size = path.stat().st_size
        if size != record["bytes"]:
            raise StoreError(
                f"shard {path} is truncated or damaged: {size:,} bytes, the "
                f"manifest recorded {record['bytes']:,}"
            )
        return True

    # ----------------------------------------------------------------- describing
    def __len__(self) -> int:
        return int(self._ends[-1]) if len(self._ends) else 0

    @property
    def n_tokens(self) -> int:
        """Tokens (= rows) in the shards present."""
        return len(self)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype activations are stored in."""
        return getattr(torch, self.manifest["dtype"])

    def row_shape(self, name: str) -> tuple[int, ...]:
        """The shape of one row of `name`."""
        return tuple(self.manifest["row_shapes"][self._check_name(name)])

    @property
    def nbytes(self) -> int:
        """Bytes on disk of the shards present."""
        return sum((self.path / s.file).stat().st_size for s in self._shards)

    def __repr__(self) -> str:
        state = (
            "complete"
            if self.complete
            else (f"in progress: {len(self._shards)} of {self.n_shards_planned} shards written")
        )
        model = self.manifest["model"]
        lines = [
            f"ActivationStore({str(self.path)!r}, {state}, {len(self._shards)} shards, "
            f"{len(self):,} tokens in contexts of {self.rows_per_context}, "
            f"{self.nbytes / 2**20:,.1f} MiB on disk)",
            f"  model {model['name']!r}, weights sha256 {model['weights_sha256'][:12]}",
        ]
        for name in self.names:
            axes = self.manifest["axes"][name][1:] or ["feature"] * len(self.row_shape(name))
            shape = " ".join(f"{a}={n}" for a, n in zip(axes, self.row_shape(name), strict=False))
            lines.append(f"  {name}  [row {shape}]  {self.manifest['dtype']}")
        return "\n".join(lines)

    # ----------------------------------------------------------------- reading rows
    def rows(self, name: str, index: int | slice | Tensor) -> Tensor:
        """Rows `index` of `name` (an int, a slice or int tensor of store-wide row numbers)."""
        index = self._as_index(index)
        return self._gather(self._check_name(name), index)

    def origin(self, index: int | slice | Tensor) -> RowOrigin:
        """The context, position and token that rows `index` were computed at."""
        index = self._as_index(index)
        shard = torch.searchsorted(self._ends, index, right=True)
        local = index - self._starts[shard]
        first_context = torch.tensor([s.start for s in self._shards], dtype=torch.long)[shard]
        context = first_context + local // self.rows_per_context
        return RowOrigin(
            context, local % self.rows_per_context, self._gather("tokens", index).long()
        )

    def batches(
        self,
        name: str,
        batch_size: int,
        *,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
        window: int = 4,
    ) -> Iterator[Tensor]:
        """Batches `[batch *row_shape]` of `name`, every row once.

        With `shuffle`, the shards are taken in an order drawn from `seed`, `window` at a
        time: the window's rows (and those left over from the last one) are copied into
        one buffer, read sequentially from the mapped files, and batches are drawn from it
        in a random order. Batches mix `window` shards; memory is about `window` shards.
        Without `shuffle`, batches are the rows in order.
        """
        name = self._check_name(name)
        if batch_size < 1 or window < 1:
            raise ValueError(f"batch_size and window must be positive, got {batch_size}, {window}")
        generator = torch.Generator().manual_seed(seed)
        n_shards = len(self._shards)
        order = torch.randperm(n_shards, generator=generator).tolist() if shuffle else None
        window = window if shuffle else 1
        carry = torch.empty((0, *self.row_shape(name)), dtype=self.dtype)
        for first in range(0, n_shards, window):
            group = order[first : first + window] if shuffle else [first]
            buffer = torch.cat([carry, *(self._map(s).tensor(name) for s in group)])
            rows = torch.randperm(buffer.shape[0], generator=generator) if shuffle else None
            n_full = buffer.shape[0] // batch_size * batch_size
            for start in range(0, n_full, batch_size):
                yield _take(buffer, rows, start, start + batch_size)
            carry = _take(buffer, rows, n_full, buffer.shape[0])
        if carry.shape[0] and not drop_last:
            yield carry

    def stats(self, name: str) -> RunningStats:
        """The per-feature mean and variance of `name` over the stored rows (float64)."""
        name = self._check_name(name)
        if self.complete:
            return read_stats(self.path, name)
        paths = [self.path / s.file for s in self._shards]
        return as_stats(shard_moments(paths, [name])[name])

    def to_torch_dataset(self, name: str) -> "StoreDataset":
        """A map-style `torch.utils.data.Dataset` of the rows of `name`, for a `DataLoader`."""
        return StoreDataset(self, self._check_name(name))

    def check_model(self, model: Any) -> None:
        """Raise a `StoreError` unless the store was written by `model`'s exact weights."""
        recorded = self.manifest["model"]
        written_by = f"the store {self.path} was written by the model {recorded['name']!r}"
        differ = weights_differ(model, recorded["weights_sha256"], written_by)
        if differ is not None:
            raise StoreError(f"{differ}: its activations are not this model's (collect them again)")

    # ----------------------------------------------------------------- internals
    def _check_name(self, name: str) -> str:
        if name not in self.names:
            message = unknown_name_message(name, self.names).replace("this model", "this store")
            raise KeyError(message)
        return name

    def _as_index(self, index: int | slice | Tensor) -> Int[Tensor, " row"]:
        n = len(self)
        if isinstance(index, slice):
            return torch.arange(n)[index]
        index = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        if index.numel() and (int(index.min()) < -n or int(index.max()) >= n):
            raise IndexError(f"row index out of range for a store of {n:,} rows")
        return index % max(n, 1)

    def _map(self, shard: int) -> _MappedShard:
        if shard not in self._maps:
            path = self.path / self._shards[shard].file
            self._maps[shard] = _MappedShard(path, self.fingerprint)
        return self._maps[shard]

    def _gather(self, key: str, index: Int[Tensor, " row"]) -> Tensor:
        shard = torch.searchsorted(self._ends, index, right=True)
        if key == "tokens":
            shape, dtype = (), torch.int32
        else:
            shape, dtype = self.row_shape(key), self.dtype
        out = torch.empty((index.numel(), *shape), dtype=dtype)
        for s in torch.unique(shard).tolist():
            where = (shard == s).nonzero().squeeze(1)
            local = index[where] - self._starts[s]
            source = self._map(s).tensor(key)
            if key == "tokens":
                source = source.reshape(-1)
            out.index_copy_(0, where, source.index_select(0, local))
        return out


def _take(buffer: Tensor, order: Tensor | None, start: int, stop: int) -> Tensor:
    """Rows `order[start:stop]` of `buffer` (rows `start:stop` without an order), copied."""
    if order is None:
        return buffer[start:stop].clone()
    return buffer.index_select(0, order[start:stop])


class StoreDataset(torch.utils.data.Dataset):
    """Rows of one name of an `ActivationStore`; `dataset[i]` is row `i`."""

    def __init__(self, store: ActivationStore, name: str) -> None:
        self.store, self.name = store, name

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, index: int) -> Tensor:
        return self.store.rows(self.name, index)[0]

    def __getitems__(self, indices: list[int]) -> list[Tensor]:
        # A DataLoader asks for a whole batch at once: one gather instead of one per row.
        return list(self.store.rows(self.name, torch.tensor(indices)).unbind(0))
