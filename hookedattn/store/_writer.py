"""The shard writer: a background thread that casts, accumulates and commits shards.

The forward runs on the caller's thread and hands each batch's activations (float32, as
the hooks saw them) to a bounded queue; this thread copies them into the shard's buffers
in the store dtype, updates the shard's running statistics, and when the shard is full
hashes each of its tensors (SHA-256, recorded in the header) and writes it as safetensors
under a temporary name, fsyncs and renames it. The queue's bound
keeps memory at one shard plus a few batches, whatever the number of tokens collected.
"""

import dataclasses
import os
import queue
import re
import threading
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch
from jaxtyping import Float, Int
from torch import Tensor

from hookedattn.store._files import commit, file_metadata, temporary_name, tensor_sha256
from hookedattn.store._manifest import STATS_PREFIX, TOKENS_KEY, ShardSpec

_STOP = object()


@dataclasses.dataclass
class RunningMoments:
    """Count, mean and sum of squared deviations (M2) per feature, combined in float64.

    A batch's moments come from shifted sums in the activations' dtype; batches are
    combined with Chan, Golub & LeVeque's pairwise update, which never subtracts two large
    sums, so the variance stays accurate when the mean is far from zero.
    """

    count: int
    mean: Float[Tensor, "*feature"]
    m2: Float[Tensor, "*feature"]

    @classmethod
    def of(cls, rows: Float[Tensor, "row ..."]) -> "RunningMoments":
        """The moments of a batch of rows, from sums in the rows' dtype taken about its first row.

        Shifted sums cost two passes (a fused Welford reduction across rows is 15x slower
        on CPU), and the shift by a data point keeps `s2 - s1^2 / n` free of cancellation.
        """
        shift = rows[0]
        deviations = rows - shift
        s1 = deviations.sum(0).double()
        s2 = (deviations * deviations).sum(0).double()
        n = rows.shape[0]
        return cls(n, shift.double() + s1 / n, (s2 - s1 * s1 / n).clamp_min(0))

    def combine(self, other: "RunningMoments") -> "RunningMoments":
        """The moments of both sets of rows together."""
        if self.count == 0:
            return other
        count = self.count + other.count
        delta = other.mean - self.mean
        mean = self.mean + delta * (other.count / count)
        m2 = self.m2 + other.m2 + delta**2 * (self.count * other.count / count)
        return RunningMoments(count, mean, m2)


@dataclasses.dataclass
class _OpenShard:
    spec: ShardSpec
    buffers: dict[str, Tensor]
    tokens: Int[Tensor, "batch pos"]
    moments: dict[str, RunningMoments]
    infinities: dict[str, int]
    contexts_done: int = 0


class ShardWriter:
    """`begin(spec)`, `add(activations, tokens)` per batch, `end()` per shard; `close()`.

    `row_shapes` maps each hook name to the shape of one row; `metadata` goes into every
    shard's header (with the fingerprint that ties the shard to its manifest). Errors on
    the writing thread (a full disk) come back from the next call.
    """

    def __init__(
        self,
        folder: Path,
        row_shapes: dict[str, tuple[int, ...]],
        dtype: torch.dtype,
        metadata: dict[str, Any],
        max_pending: int = 4,
    ) -> None:
        self.folder, self.row_shapes, self.dtype, self.metadata = (
            folder,
            row_shapes,
            dtype,
            metadata,
        )
        self.max_finite = torch.finfo(dtype).max
        self.infinities = dict.fromkeys(row_shapes, 0)
        self.committed: list[int] = []
        self._queue: queue.Queue = queue.Queue(max_pending)
        self._error: BaseException | None = None
        self._shard: _OpenShard | None = None
        self._thread = threading.Thread(target=self._run, name="shard-writer", daemon=True)
        self._thread.start()

    def begin(self, spec: ShardSpec) -> None:
        """Start shard `spec`."""
        self._put(("begin", spec))

    def add(self, activations: dict[str, Tensor], tokens: Int[Tensor, "batch pos"]) -> None:
        """Queue one batch: activations `[row *feature]` per name, and its contexts' tokens."""
        self._put(("add", (activations, tokens)))

    def end(self) -> None:
        """The shard begun last is complete: commit it."""
        self._put(("end", None))

    def close(self) -> None:
        """Wait for every queued shard to be committed; raise what the thread raised."""
        self._put(_STOP)
        self._thread.join()
        self._raise_error()

    def abort(self) -> None:
        """Stop the thread without committing the shard in progress (after an error here)."""
        if self._thread.is_alive():
            self._queue.put(_STOP)  # the thread drains the queue, so this finds room
            self._thread.join()

    def _put(self, item: Any) -> None:
        while True:
            self._raise_error()
            try:
                self._queue.put(item, timeout=0.05)
                return
            except queue.Full:
                continue

    def _raise_error(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            self.abort()
            raise error

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            if self._error is not None:
                continue  # drain until STOP
            kind, payload = item
            try:
                getattr(self, f"_{kind}")(payload)
            except BaseException as error:  # handed to the caller's thread
                self._error = error

    def _begin(self, spec: ShardSpec) -> None:
        n_rows = spec.rows[1] - spec.rows[0]
        buffers = {
            n: torch.empty((n_rows, *shape), dtype=self.dtype)
            for n, shape in self.row_shapes.items()
        }
        tokens = torch.empty((spec.stop - spec.start, spec.rows_per_context), dtype=torch.int32)
        moments = {n: RunningMoments(0, torch.zeros(()), torch.zeros(())) for n in self.row_shapes}
        self._shard = _OpenShard(spec, buffers, tokens, moments, dict.fromkeys(self.row_shapes, 0))

    def _add(self, payload: tuple[dict[str, Tensor], Tensor]) -> None:
        activations, tokens = payload
        shard = self._shard
        first = shard.contexts_done * shard.spec.rows_per_context
        for name, rows in activations.items():
            target = shard.buffers[name][first : first + rows.shape[0]]
            target.copy_(rows)
            shard.moments[name] = shard.moments[name].combine(RunningMoments.of(rows))
            # Only a narrower range can overflow (float16 always; bfloat16 from float64).
            if self.max_finite < torch.finfo(rows.dtype).max / 2:
                new = int(torch.isinf(target).sum()) - int(torch.isinf(rows).sum())
                shard.infinities[name] += new
        shard.tokens[shard.contexts_done : shard.contexts_done + tokens.shape[0]] = tokens
        shard.contexts_done += tokens.shape[0]

    def _end(self, _: None) -> None:
        shard, self._shard = self._shard, None
        expected = shard.spec.stop - shard.spec.start
        assert shard.contexts_done == expected, (shard.contexts_done, expected)
        tensors = {**shard.buffers, TOKENS_KEY: shard.tokens}
        for name, m in shard.moments.items():
            tensors[f"{STATS_PREFIX}{name}.mean"] = m.mean.contiguous()
            tensors[f"{STATS_PREFIX}{name}.m2"] = m.m2.contiguous()
        record = {
            **self.metadata,
            "shard": shard.spec.index,
            "contexts": [shard.spec.start, shard.spec.stop],
            "infinities": shard.infinities,
            # The bytes as computed, hashed before they reach the disk (`_shard_file`).
            "sha256": {key: tensor_sha256(t) for key, t in tensors.items()},
        }
        metadata = file_metadata(record)
        final = self.folder / shard.spec.file
        tmp = temporary_name(final)
        try:
            _save_file(tensors, tmp, metadata)
            commit(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        for name, count in shard.infinities.items():
            self.infinities[name] += count
        self.committed.append(shard.spec.index)


def _save_file(tensors: dict[str, Tensor], path: Path, metadata: dict[str, str]) -> None:
    """`safetensors.torch.save_file`, with its I/O failures (a full disk) as `OSError`s."""
    try:
        safetensors.torch.save_file(tensors, str(path), metadata=metadata)
    except safetensors.SafetensorError as error:
        # The Rust side reports the OS error only in its message ("... (os error 28)").
        found = re.search(r"os error (\d+)", str(error))
        if found is None:
            raise
        code = int(found.group(1))
        raise OSError(code, f"{os.strerror(code)} while writing {path}") from error
