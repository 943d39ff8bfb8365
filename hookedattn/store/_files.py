"""Files of a store: written whole or not at all, their metadata, and their content hashes.

Every file is written under a temporary name (`.NAME.tmp-HOST-PID`, which no reader takes
for a store file), fsynced and renamed. A temporary file is removed by the process that
made it; one left behind by a writer that was killed is removed by the next collection,
but only once that writer's process is known to be gone (same host, no such pid), so a
second writer never deletes a live writer's shard in flight.
"""

import ctypes
import hashlib
import json
import os
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from torch import Tensor

METADATA_KEY = "hookedattn"
_TEMPORARY = ".tmp-"


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
    return final.with_name(f".{final.name}{_TEMPORARY}{socket.gethostname()}-{os.getpid()}")


def stale_temporary_files(folder: Path) -> Iterator[Path]:
    """The temporary files in `folder` whose writer is gone: made on this host by a process
    that no longer exists (names without a host, from older versions, count as this host's).
    A file of a live process, or of another host (a shared filesystem), is never listed."""
    host = socket.gethostname()
    for path in folder.glob(f".*{_TEMPORARY}*"):
        owner = path.name.rsplit(_TEMPORARY, 1)[1]
        made_on, _, pid = owner.rpartition("-")
        if made_on in ("", host) and pid.isdigit() and not _alive(int(pid)):
            yield path


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: nothing is sent, the pid is only looked up
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def file_metadata(record: dict[str, Any]) -> dict[str, str]:
    """A safetensors header's metadata holding `record` under one key.

    safetensors writes its metadata map in hash order, which changes from process to
    process; one key holding sorted JSON keeps a file's bytes the same on every run.
    """
    return {METADATA_KEY: json.dumps(record, sort_keys=True)}


def read_file_metadata(metadata: dict[str, str] | None) -> dict[str, Any]:
    """The record `file_metadata` stored (empty for a file that holds none)."""
    try:
        record = json.loads((metadata or {})[METADATA_KEY])
    except (KeyError, TypeError, json.JSONDecodeError, RecursionError):
        return {}
    return record if isinstance(record, dict) else {}


def tensor_sha256(tensor: Tensor) -> str:
    """SHA-256 of a CPU tensor's bytes as safetensors stores them (row-major, the machine's
    little-endian order), read in place: no copy of a contiguous tensor is made."""
    tensor = tensor.contiguous()
    if tensor.nbytes == 0:
        return hashlib.sha256(b"").hexdigest()
    view = (ctypes.c_char * tensor.nbytes).from_address(tensor.data_ptr())
    return hashlib.sha256(view).hexdigest()


def bytes_sha256(data: Any) -> str:
    """SHA-256 of a bytes-like object (a slice of a mapped file, read in place)."""
    return hashlib.sha256(data).hexdigest()
