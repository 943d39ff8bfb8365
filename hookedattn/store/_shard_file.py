"""One shard file, read in place and checked: the header always, the contents once.

Opening a shard reads its header only (at most `MAX_HEADER_BYTES`, and never more than
the file holds) and checks it against what the manifest says the shard must be: this
collection's fingerprint, this shard's index and contexts, exactly the tensors of its
layout with their dtypes and shapes, laid end to end over the whole file, and the SHA-256
of each (the same as the complete manifest's). A header edited in place (shifted
`data_offsets`, F32 turned F16, a smaller shape, a shard copied over another) is refused
there, by name. Each tensor's bytes are hashed the first time it is read through this
`MappedShard` (`verify=True`), so a flipped bit in the data is refused before any row of
that tensor is returned; reading on costs nothing more.
"""

import json
import mmap
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from hookedattn.store._files import bytes_sha256, read_file_metadata
from hookedattn.store._manifest import ShardSpec, StoreError, TensorSpec

# The safetensors library's own limit on a header.
MAX_HEADER_BYTES = 100 << 20
_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I32": torch.int32,
}
REMEDY = (
    "rerun the same collect_activations call: it computes damaged and missing shards "
    "again, and only those"
)


def read_header(path: Path) -> tuple[dict[str, Any], dict[str, Any], int, int]:
    """A safetensors file's tensor entries, its hookedattn metadata record, the offset of
    its data and its size, without reading past the header."""
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        prefix = f.read(8)
        n_header = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if not 0 < n_header <= min(MAX_HEADER_BYTES, size - 8):
            raise StoreError(
                f"shard {path} is truncated or damaged: its header length {n_header:,} does "
                f"not fit a file of {size:,} bytes; {REMEDY}"
            )
        raw = f.read(n_header)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise StoreError(f"shard {path} has a damaged header ({error}); {REMEDY}") from None
    if not isinstance(header, dict):
        raise StoreError(f"shard {path} has a damaged header (not a JSON object); {REMEDY}")
    record = read_file_metadata(header.pop("__metadata__", None))
    return header, record, 8 + n_header, size


class MappedShard:
    """Shard `spec` of the collection `fingerprint`, mapped copy-on-write (nothing is ever
    written back), its header checked against `layout` (see the module docstring).

    `recorded` is the complete manifest's SHA-256 of each tensor (None for a store in
    progress, whose shards are checked against their own headers' hashes); with
    `verify`, each tensor is hashed on its first read.
    """

    def __init__(
        self,
        path: Path,
        spec: ShardSpec,
        fingerprint: str,
        layout: dict[str, TensorSpec],
        recorded: dict[str, str] | None = None,
        verify: bool = True,
    ) -> None:
        self.path, self.verify = path, verify
        entries, record, self.data_start, size = read_header(path)
        _check_identity(path, record, spec, fingerprint)
        self.offsets = _check_entries(path, entries, layout, size - self.data_start)
        self.layout = layout
        self.sha256 = _check_hashes(path, record, layout, recorded)
        self.infinities: dict[str, int] = record.get("infinities", {})
        with open(path, "rb") as f:
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY)
        self._tensors: dict[str, Tensor] = {}
        self._verified: set[str] = set()

    def tensor(self, key: str) -> Tensor:
        """The tensor `key`, a view of the mapped file (hashed first, on its first read)."""
        if self.verify and key not in self._verified:
            self.check(key)
        if key not in self._tensors:
            spec = self.layout[key]
            count = 1
            for size in spec.shape:
                count *= size
            begin, _ = self.offsets[key]
            flat = torch.frombuffer(
                self.map, dtype=_DTYPES[spec.dtype], count=count, offset=self.data_start + begin
            )
            self._tensors[key] = flat.reshape(spec.shape)
        return self._tensors[key]

    def check(self, key: str) -> None:
        """Hash the bytes of tensor `key`; a `StoreError` unless they are the recorded ones."""
        begin, end = self.offsets[key]
        with memoryview(self.map) as data:
            actual = bytes_sha256(data[self.data_start + begin : self.data_start + end])
        if actual != self.sha256[key]:
            raise StoreError(
                f"shard {self.path} is damaged: the bytes of {key!r} hash to {actual[:12]}, "
                f"not the {self.sha256[key][:12]} recorded when it was written; {REMEDY}"
            )
        self._verified.add(key)

    def check_all(self) -> None:
        """Hash every tensor of the shard (`ActivationStore.verify`)."""
        for key in self.layout:
            if key not in self._verified:
                self.check(key)


def _check_identity(path: Path, record: dict[str, Any], spec: ShardSpec, fingerprint: str) -> None:
    if record.get("fingerprint") != fingerprint:
        raise StoreError(
            f"shard {path} belongs to another collection (fingerprint "
            f"{str(record.get('fingerprint'))[:12]!r}, manifest {fingerprint[:12]!r}); {REMEDY}"
        )
    contexts = [spec.start, spec.stop]
    if record.get("shard") != spec.index or record.get("contexts") != contexts:
        raise StoreError(
            f"shard {path} holds shard {record.get('shard')!r} (contexts "
            f"{record.get('contexts')!r}), not shard {spec.index} (contexts {contexts}): a "
            f"shard copied over another, or two swapped; {REMEDY}"
        )
    infinities = record.get("infinities")
    if not isinstance(infinities, dict) or not all(
        isinstance(v, int) and v >= 0 for v in infinities.values()
    ):
        raise StoreError(f"shard {path} has a damaged header (its infinities); {REMEDY}")


def _check_entries(
    path: Path, entries: dict[str, Any], layout: dict[str, TensorSpec], n_data: int
) -> dict[str, tuple[int, int]]:
    """Each tensor's `(begin, end)` in the data, once the header is checked to describe the
    layout's tensors exactly, end to end over the whole file."""
    if set(entries) != set(layout):
        raise StoreError(
            f"shard {path} holds the tensors {sorted(entries)}, not {sorted(layout)}; {REMEDY}"
        )
    offsets = {}
    for key, spec in layout.items():
        entry = entries[key]
        got = (entry.get("dtype"), entry.get("shape")) if isinstance(entry, dict) else entry
        if got != (spec.dtype, list(spec.shape)):
            raise StoreError(
                f"shard {path}: its header describes {key!r} as {got!r}, not "
                f"{(spec.dtype, list(spec.shape))!r} (a header edited in place); {REMEDY}"
            )
        bounds = entry.get("data_offsets")
        n_bytes = _DTYPES[spec.dtype].itemsize
        for size in spec.shape:
            n_bytes *= size
        if not (_ints(bounds) and len(bounds) == 2 and bounds[1] - bounds[0] == n_bytes):
            raise StoreError(f"shard {path}: {key!r} has data_offsets {bounds!r}; {REMEDY}")
        offsets[key] = (bounds[0], bounds[1])
    position = 0
    for begin, end in sorted(offsets.values()):
        if begin != position:
            raise StoreError(
                f"shard {path}: its tensors do not lie end to end (one starts at {begin:,}, "
                f"the one before ends at {position:,}); {REMEDY}"
            )
        position = end
    if position != n_data:
        raise StoreError(
            f"shard {path}: its header describes {position:,} bytes of data, the file holds "
            f"{n_data:,}; {REMEDY}"
        )
    return offsets


def _ints(values: Any) -> bool:
    return isinstance(values, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in values
    )


def _check_hashes(
    path: Path,
    record: dict[str, Any],
    layout: dict[str, TensorSpec],
    recorded: dict[str, str] | None,
) -> dict[str, str]:
    hashes = record.get("sha256")
    if not isinstance(hashes, dict) or set(hashes) != set(layout):
        raise StoreError(f"shard {path} records no SHA-256 of its tensors; {REMEDY}")
    if recorded is not None and hashes != recorded:
        differ = sorted(k for k in layout if hashes[k] != recorded.get(k))
        raise StoreError(
            f"shard {path} is not the file the manifest recorded: the SHA-256 of {differ} "
            f"differ (the file was replaced after the store was completed); {REMEDY}"
        )
    return hashes
