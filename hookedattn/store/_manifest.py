"""The store's layout on disk and its manifest, the record that commits it.

    acts/
      manifest.json            what was collected, how, and which shards hold which rows
      shard-00000.safetensors  rows of contexts 0..S-1: one tensor per hook name, the tokens,
      shard-00001.safetensors  and that shard's running statistics
      ...

Shard `k` holds contexts `k*S .. (k+1)*S` (S = `shard_contexts`), whoever computed it, so a
collection on any number of ranks writes the same files. Every file is written under a
temporary name, fsynced and renamed: a file under its final name is whole. The manifest
is written when a collection starts (`status: "writing"`) and rewritten when the last
shard is in (`"complete"`, with each shard's size); a reader trusts a shard only if its
name and its header's fingerprint say it belongs to this manifest.
"""

import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Any

import safetensors.torch

FORMAT = "hookedattn-activation-store"
VERSION = 1
MANIFEST_FILE = "manifest.json"
STATS_PREFIX = "__stats__."
TOKENS_KEY = "tokens"
METADATA_KEY = "hookedattn"


class StoreError(ValueError):
    """A folder that is not an activation store, or one that is damaged or incomplete."""


def shard_file(index: int) -> str:
    """The file name of shard `index`."""
    return f"shard-{index:05d}.safetensors"


@dataclasses.dataclass(frozen=True)
class ShardSpec:
    """Shard `index`: contexts `start .. stop`, `rows_per_context` rows each."""

    index: int
    start: int
    stop: int
    rows_per_context: int

    @property
    def file(self) -> str:
        """The shard's file name."""
        return shard_file(self.index)

    @property
    def rows(self) -> tuple[int, int]:
        """The store-wide rows this shard holds, `(first, end)`."""
        return self.start * self.rows_per_context, self.stop * self.rows_per_context

    def to_dict(self) -> dict[str, Any]:
        """The manifest's record of the shard: file, context range and row range."""
        return {
            "index": self.index,
            "file": self.file,
            "contexts": [self.start, self.stop],
            "rows": list(self.rows),
        }


def plan_shards(n_contexts: int, shard_contexts: int, rows_per_context: int) -> list[ShardSpec]:
    """The shards of `n_contexts` contexts, `shard_contexts` to a shard (the last one shorter)."""
    return [
        ShardSpec(i, start, min(start + shard_contexts, n_contexts), rows_per_context)
        for i, start in enumerate(range(0, n_contexts, shard_contexts))
    ]


def file_metadata(record: dict[str, Any]) -> dict[str, str]:
    """A safetensors header's metadata holding `record` under one key.

    safetensors writes its metadata map in hash order, which changes from process to
    process; one key holding sorted JSON keeps a file's bytes the same on every run.
    """
    return {METADATA_KEY: json.dumps(record, sort_keys=True)}


def read_file_metadata(metadata: dict[str, str] | None) -> dict[str, Any]:
    """The record `file_metadata` stored (empty for a file that holds none)."""
    try:
        return json.loads((metadata or {})[METADATA_KEY])
    except (KeyError, json.JSONDecodeError):
        return {}


def weights_sha256(model: Any) -> str:
    """SHA-256 of the model's state dict as safetensors bytes (names, dtypes, shapes, values)."""
    tensors = {n: t.detach().contiguous().cpu() for n, t in model.state_dict().items()}
    return hashlib.sha256(safetensors.torch.save(tensors)).hexdigest()


def weights_differ(model: Any, recorded_sha256: str, written_by: str) -> str | None:
    """None when `model`'s weights hash to `recorded_sha256`; otherwise a sentence that
    starts with `written_by` (what was made from the recorded weights) and gives both
    hashes, for the caller's error to end with what to do."""
    actual = weights_sha256(model)
    if actual == recorded_sha256:
        return None
    return (
        f"{written_by} with weights sha256 {recorded_sha256[:12]}; this model's weights hash "
        f"to {actual[:12]}"
    )


def fingerprint(plan: dict[str, Any]) -> str:
    """A digest of everything that decides the bytes of the shards."""
    return hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()


def commit(tmp: Path, final: Path) -> None:
    """Make the file `tmp` durable, then rename it to `final` (atomic on POSIX)."""
    with open(tmp, "rb") as f:
        os.fsync(f.fileno())
    os.replace(tmp, final)
    directory = os.open(final.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself survives a power cut only once its folder is synced
    finally:
        os.close(directory)


def temporary_name(final: Path) -> Path:
    """A name beside `final`, unique to this process, that no reader takes for a store file."""
    return final.with_name(f".{final.name}.tmp-{os.getpid()}")


def write_manifest(folder: Path, manifest: dict[str, Any]) -> None:
    """Write `manifest.json` atomically."""
    final = folder / MANIFEST_FILE
    tmp = temporary_name(final)
    try:
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        commit(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def read_manifest(folder: str | Path) -> dict[str, Any]:
    """The manifest of the store in `folder`, checked for format and version."""
    folder = Path(folder)
    path = folder / MANIFEST_FILE
    if not folder.is_dir():
        raise StoreError(f"{folder} is not a folder, so not an activation store")
    if not path.is_file():
        found = sorted(p.name for p in folder.iterdir())[:5]
        raise StoreError(
            f"{folder} is not an activation store: it has no {MANIFEST_FILE} (it holds "
            f"{found or 'nothing'}); collect one with hookedattn.store.collect_activations"
        )
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise StoreError(f"{path} is not valid JSON ({error}): not a readable store") from error
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise StoreError(
            f"{path} is not an activation-store manifest: format {got!r}, expected {FORMAT!r}"
        )
    if manifest.get("version") != VERSION:
        raise StoreError(
            f"{path} was written by format version {manifest.get('version')!r}; this "
            f"hookedattn reads version {VERSION}: collect the store again with this version"
        )
    return manifest
