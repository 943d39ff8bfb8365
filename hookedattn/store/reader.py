"""`ActivationStore`: a collected store, memory-mapped, read by row or in shuffled batches.

Nothing is loaded when a store is opened: each shard is mapped (`mmap`) the first time a
row of it is read, and rows are gathered straight from the page cache. Rows are numbered
store-wide in shard order (context after context, position after position), so row
`i` of every name comes from the same token, `tokens(i)`.

What is verified, and when: opening checks the manifest (every field, the fingerprint of
its plan, the shard records) and, for a complete store, each shard's size; a shard's
header is checked against the manifest when the shard is first mapped; each tensor's
bytes are hashed (SHA-256) the first time this store reads it, and refused unless they are
the bytes written (`verify_content=False` skips the hashing; `verify()` hashes everything
now). `stats.safetensors` is hashed whenever it is read.

A store whose manifest says `"writing"` (a collection in progress, or one that stopped)
shows only the shards already committed: a shard file appears under its final name only
once it is whole. Its rows are numbered over those shards; `origin` gives each row's
context in the packed inputs either way.
"""

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.utils.data
from jaxtyping import Int
from torch import Tensor

from hookedattn.core.names import unknown_name_message
from hookedattn.store._manifest import (
    TOKENS_KEY,
    ShardSpec,
    StoreError,
    read_manifest,
    shard_layout,
    shard_specs,
    weights_differ,
)
from hookedattn.store._shard_file import MappedShard
from hookedattn.store._stats import STATS_FILE, RunningStats, as_stats, read_stats, shard_moments


@dataclasses.dataclass(frozen=True)
class RowOrigin:
    """Where rows come from: the `context` index (in the packed inputs), the `position` in
    it, and the `token` there; each of the index's shape."""

    context: Int[Tensor, "*index"]
    position: Int[Tensor, "*index"]
    token: Int[Tensor, "*index"]


class ActivationStore:
    """The store in folder `path`; with `model`, refused unless written by the same weights.

    `verify_content` (default on): each shard tensor's bytes are hashed the first time
    this store reads them, and a `StoreError` names a shard whose bytes are not the ones
    written (module docstring).
    """

    def __init__(self, path: str | Path, model: Any = None, *, verify_content: bool = True) -> None:
        if not isinstance(verify_content, bool):
            raise TypeError(f"verify_content must be True or False, got {verify_content!r}")
        self.path = Path(path)
        self.manifest = read_manifest(self.path)
        self.complete = self.manifest["status"] == "complete"
        self.verify_content = verify_content
        self.fingerprint = self.manifest["fingerprint"]
        self.names: list[str] = list(self.manifest["names"])
        self.rows_per_context: int = self.manifest["rows_per_context"]
        listed = self.manifest["shards"]
        self.n_shards_planned = len(listed)
        specs = shard_specs(self.manifest)  # the manifest's records, checked to be these
        self._shards = [s for s, r in zip(specs, listed, strict=True) if self._present(s, r)]
        self._records = {s.index: r for s, r in zip(specs, listed, strict=True)}
        ends = torch.tensor([s.rows[1] - s.rows[0] for s in self._shards], dtype=torch.long)
        self._ends = ends.cumsum(0)
        self._starts = self._ends - ends
        self._maps: dict[int, MappedShard] = {}
        if model is not None:
            self.check_model(model)

    def _present(self, spec: ShardSpec, record: dict) -> bool:
        path = self.path / spec.file
        if not self.complete:
            return path.is_file()  # committed by rename, so whole
        if not path.is_file():
            raise StoreError(
                f"shard {spec.file} of the complete store {self.path} is missing "
                f"(it held contexts {spec.start}..{spec.stop}); rerun the same "
                f"collect_activations call to compute it again"
            )
        size = path.stat().st_size
        if size != record["bytes"]:
            raise StoreError(
                f"shard {path} is truncated or damaged: {size:,} bytes, the manifest "
                f"recorded {record['bytes']:,}; rerun the same collect_activations call: "
                f"it computes damaged and missing shards again, and only those"
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
    def rows(self, name: str, index: Any) -> Tensor:
        """Rows `index` of `name`, indexed as numpy does: an int gives one row
        `[*row_shape]`, a slice `[n *row_shape]`, an int tensor or (nested) list of ints of
        any shape `S` `[*S *row_shape]`. Row numbers are store-wide and may be negative
        (from the end); float and bool indices are refused, not truncated."""
        index = self._as_index(index)
        return self._gather(self._check_name(name), index)

    def origin(self, index: Any) -> RowOrigin:
        """The context, position and token that rows `index` (as in `rows`) were computed at."""
        index = self._as_index(index)
        flat = index.reshape(-1)
        shard = torch.searchsorted(self._ends, flat, right=True)
        local = flat - self._starts[shard]
        first_context = torch.tensor([s.start for s in self._shards], dtype=torch.long)[shard]
        context = (first_context + local // self.rows_per_context).reshape(index.shape)
        position = (local % self.rows_per_context).reshape(index.shape)
        return RowOrigin(context, position, self._gather(TOKENS_KEY, index).long())

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
        for field, value in (("batch_size", batch_size), ("window", window)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{field} must be a positive int, got {value!r}")
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
            return read_stats(self.path, name, self.manifest, len(self))
        shards = [self._map(i) for i in range(len(self._shards))]
        return as_stats(shard_moments(shards, [name])[name])

    def verify(self) -> None:
        """Hash every shard's tensors and the statistics now (also with `verify_content`
        off); a `StoreError` lists every shard whose header or bytes are not the ones
        written, with the remedy. Costs one read of the whole store."""
        problems = []
        for i, spec in enumerate(self._shards):
            try:
                self._map(i).check_all()
            except StoreError as error:
                problems.append((spec.file, str(error)))
        if self.complete:
            try:
                for name in self.names:
                    read_stats(self.path, name, self.manifest, len(self))
            except StoreError as error:
                problems.append((STATS_FILE, str(error)))
        if problems:
            listed = "; ".join(message for _, message in problems)
            files = ", ".join(file for file, _ in problems)
            raise StoreError(f"{len(problems)} damaged file(s) in {self.path} ({files}): {listed}")

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

    def _as_index(self, index: Any) -> Int[Tensor, "*index"]:
        n = len(self)
        if isinstance(index, slice):
            return torch.arange(n)[index]
        if isinstance(index, bool) or (isinstance(index, Tensor) and index.dtype == torch.bool):
            raise TypeError(
                f"row indices are ints, not bools ({index!r}); for a mask, pass "
                f"mask.nonzero().squeeze(1)"
            )
        if isinstance(index, int) and not -n <= index < n:
            raise IndexError(_out_of_range(index, n, self.path))  # also past int64
        try:
            tensor = torch.as_tensor(index)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(
                f"row indices must be ints, a slice or an int tensor: {error}"
            ) from None
        if tensor.numel() == 0:
            tensor = tensor.long()
        if tensor.dtype.is_floating_point or tensor.dtype.is_complex or tensor.dtype == torch.bool:
            raise TypeError(
                f"row indices must be integers, got {tensor.dtype} ({index!r:.60}): a float "
                f"index would be truncated; convert it yourself (e.g. .long()) if you mean that"
            )
        tensor = tensor.long()
        if tensor.numel() and (int(tensor.min()) < -n or int(tensor.max()) >= n):
            bad = int(tensor.min()) if int(tensor.min()) < -n else int(tensor.max())
            raise IndexError(_out_of_range(bad, n, self.path))
        return tensor % max(n, 1)

    def _map(self, shard: int) -> MappedShard:
        if shard not in self._maps:
            spec = self._shards[shard]
            record = self._records[spec.index]
            recorded = None
            if self.complete:
                recorded = {key: t["sha256"] for key, t in record["tensors"].items()}
            layout = shard_layout(self.manifest, spec)
            path = self.path / spec.file
            self._maps[shard] = MappedShard(
                path, spec, self.fingerprint, layout, recorded, self.verify_content
            )
        return self._maps[shard]

    def _gather(self, key: str, index: Int[Tensor, "*index"]) -> Tensor:
        flat = index.reshape(-1)
        shard = torch.searchsorted(self._ends, flat, right=True)
        if key == TOKENS_KEY:
            shape, dtype = (), torch.int32
        else:
            shape, dtype = self.row_shape(key), self.dtype
        out = torch.empty((flat.numel(), *shape), dtype=dtype)
        for s in torch.unique(shard).tolist():
            where = (shard == s).nonzero().squeeze(1)
            local = flat[where] - self._starts[s]
            source = self._map(s).tensor(key)
            if key == TOKENS_KEY:
                source = source.reshape(-1)
            out.index_copy_(0, where, source.index_select(0, local))
        return out.reshape((*index.shape, *shape))


def _out_of_range(row: int, n: int, path: Path) -> str:
    return f"row {row} is out of range for the store {path} of {n:,} rows (valid: {-n}..{n - 1})"


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
        return self.store.rows(self.name, index)

    def __getitems__(self, indices: list[int]) -> list[Tensor]:
        # A DataLoader asks for a whole batch at once: one gather instead of one per row.
        return list(self.store.rows(self.name, torch.tensor(indices)).unbind(0))
