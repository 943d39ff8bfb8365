"""`collect_activations`: run a model over packed contexts and stream chosen activations to disk.

Each rank (see `_distributed`) computes the shards `rank, rank + world_size, ...`; a shard
already on disk under its final name with this collection's fingerprint is kept, so a
rerun after a crash does only what is missing and ends with the same bytes. Rank 0 writes
the manifest before the others start and again, complete, after they are all done.

A tensor-parallel model's ranks hold one model between them: they run every shard
together (the same contexts in the same order, as its collectives need), its hooks see
whole activations, and rank 0 alone writes; the bytes are the one-process collection's
to float rounding, and the weights are hashed whole (`weights_sha256`).
"""

import dataclasses
import errno
import json
import math
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from tqdm.auto import tqdm

from hookedattn.core import names as _names
from hookedattn.store import _distributed
from hookedattn.store._files import stale_temporary_files
from hookedattn.store._manifest import (
    FORMAT,
    MANIFEST_FILE,
    VERSION,
    ShardSpec,
    StoreError,
    fingerprint,
    plan_shards,
    read_manifest,
    shard_layout,
    weights_sha256,
    write_manifest,
)
from hookedattn.store._shard_file import MappedShard, read_header
from hookedattn.store._stats import write_stats
from hookedattn.store._writer import ShardWriter
from hookedattn.store.inputs import PackedContexts, pack

DTYPES = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
}
DEFAULT_SHARD_BYTES = 64 * 2**20


@dataclasses.dataclass(frozen=True)
class Collection:
    """What one rank did: shards it `written` now, shards it found already `resumed`.

    `seconds` (wall clock) and `cpu_seconds` (this process, every thread) cover the
    forward passes, the writing and the final manifest: everything after the setup
    (packing, the weight hash, the folder checks).
    """

    path: Path
    fingerprint: str
    n_shards: int
    written: tuple[int, ...]
    resumed: tuple[int, ...]
    tokens: int
    seconds: float
    cpu_seconds: float

    @property
    def tokens_per_second(self) -> float:
        """Tokens this rank computed per second of wall clock."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


def collect_activations(
    model: Any,
    inputs: Any = None,
    *,
    names: Sequence[str | tuple],
    out: str | Path,
    context: int | None = None,
    n_tokens: int | float | None = None,
    batch_size: int = 32,
    dtype: torch.dtype = torch.float32,
    shard_contexts: int | None = None,
    overwrite: bool = False,
    progress: bool = True,
) -> Collection:
    """Collect the activations at `names` over `inputs` into the store folder `out`.

    `inputs` as in `hookedattn.store.inputs.pack` (None: the standard library's source);
    `context` tokens per context (default the model's `n_ctx`), `n_tokens` at most. Rows are
    stored in `dtype`, one per position, context after context; `shard_contexts` contexts
    to a shard (default: about 64 MiB of activations, a multiple of `batch_size`). A
    folder holding a different collection is refused unless `overwrite`. Under `torchrun`
    every rank calls this with the same arguments.

    The store holds the model's own activations: a model with hooks attached (an edit, a
    spliced SAE, a permanent `add_hook`) is refused, since what a hook does cannot be
    recorded in the store's fingerprint or checked when the store is read.
    """
    _check_options(dtype, batch_size, shard_contexts)
    _check_no_hooks(model)
    out, ranks = Path(out), _distributed.current_rank()
    job = _plan_job(model, inputs, names, context, n_tokens, batch_size, dtype, shard_contexts)
    if ranks.is_main:
        _prepare_folder(out, job.digest, overwrite)
        write_manifest(out, job.manifest)
    _distributed.barrier()
    split = getattr(model, "tp", None) is not None  # its ranks run every shard together
    mine = job.shards if split else [job.shards[i] for i in ranks.share(len(job.shards))]
    started, cpu_started = time.perf_counter(), time.process_time()
    done = [s for s in mine if _shard_is_complete(out / s.file, s, job)]
    if split:  # every rank must run the same shards: rank 0's reading of the folder decides
        done = _distributed.from_main(done)
    todo = [s for s in mine if s not in done]
    writes = ranks.is_main or not split
    _write_shards(model, job, out, todo, dtype, _bar(todo, ranks, progress), writes)
    _distributed.barrier()
    if ranks.is_main:
        _finish(out, job.manifest, job.shards, job.names, dtype)
    _distributed.barrier()
    tokens = sum(s.stop - s.start for s in todo) * job.packed.packing.context
    written, resumed = tuple(s.index for s in todo), tuple(s.index for s in done)
    wall, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    return Collection(out, job.digest, len(job.shards), written, resumed, tokens, wall, cpu)


@dataclasses.dataclass(frozen=True)
class _Job:
    """What every rank computes identically before any work: inputs, names, layout."""

    packed: PackedContexts
    names: list[str]
    stop_at: int | None
    row_shapes: dict[str, tuple[int, ...]]
    batch_size: int
    shards: list[ShardSpec]
    digest: str
    manifest: dict[str, Any]


def _plan_job(
    model: Any,
    inputs: Any,
    names: Sequence[str | tuple],
    context: int | None,
    n_tokens: int | float | None,
    batch_size: int,
    dtype: torch.dtype,
    shard_contexts: int | None,
) -> _Job:
    full_names = resolve_names(model, names)
    packed = pack(model, inputs, context=context, n_tokens=n_tokens)
    stop_at = _stop_layer(full_names, model.cfg.n_layers)
    row_shapes = _row_shapes(model, packed, full_names, stop_at)
    if shard_contexts is None:
        per_context = packed.packing.context * sum(math.prod(s) for s in row_shapes.values())
        per_shard = DEFAULT_SHARD_BYTES // (per_context * dtype.itemsize) // batch_size
        shard_contexts = max(1, per_shard) * batch_size
    plan = _plan(model, full_names, dtype, packed, batch_size, shard_contexts, row_shapes)
    digest = fingerprint(plan)
    shards = plan_shards(len(packed), shard_contexts, packed.packing.context)
    manifest = {
        **plan,
        "fingerprint": digest,
        "status": "writing",
        "shards": [s.to_dict() for s in shards],
    }
    return _Job(packed, full_names, stop_at, row_shapes, batch_size, shards, digest, manifest)


def _check_options(dtype: torch.dtype, batch_size: Any, shard_contexts: Any) -> None:
    if dtype not in DTYPES.values():
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype}")
    for field, value in (("batch_size", batch_size), ("shard_contexts", shard_contexts)):
        if field == "shard_contexts" and value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{field} must be a positive int, got {value!r}")


def _check_no_hooks(model: Any) -> None:
    attached = model.attached_hooks() if hasattr(model, "attached_hooks") else []
    if attached:
        shown = ", ".join(
            f"{getattr(h.fn, '__name__', type(h.fn).__name__)} at {h.hook_point.name}"
            for h in attached[:4]
        )
        raise ValueError(
            f"collect_activations stores the model's own activations, but {len(attached)} "
            f"hook(s) are attached ({shown}{' ...' if len(attached) > 4 else ''}): what a "
            f"hook does cannot be recorded in the store's fingerprint, so a resumed run "
            f"could mix edited and clean shards. Remove them first "
            f"(model.reset_hooks(including_permanent=True), or leave the `with` block)"
        )


def _write_shards(
    model: Any,
    job: _Job,
    out: Path,
    todo: list[ShardSpec],
    dtype: torch.dtype,
    bar: Any,
    writes: bool = True,
) -> None:
    """Compute and write the shards `todo` (only compute them where not `writes`: a
    tensor-parallel rank other than 0); a full disk is an error saying what is kept."""
    if not writes:
        _run(model, job, todo, _NoWriter(), bar)
        return
    writer = ShardWriter(out, job.row_shapes, dtype, {"fingerprint": job.digest})
    try:
        _run(model, job, todo, writer, bar)
    except OSError as error:
        raise _disk_error(error, out, job.shards) from error


def resolve_names(model: Any, names: Sequence[str | tuple]) -> list[str]:
    """Full hook names for `names` (full names or shorthand such as `("resid_pre", 1)`).

    A name the model has no hook point for is a `KeyError` with the closest valid names.
    """
    if isinstance(names, str | tuple) or not names:
        raise TypeError(f"names must be a non-empty list of hook names, got {names!r}")
    resolved = []
    for name in names:
        full = _names.expand_key(name, model.cfg.n_layers)
        if full not in model.hook_dict:
            raise KeyError(_names.unknown_name_message(full, model.hook_dict))
        if full not in resolved:
            resolved.append(full)
    return resolved


def _shard_is_complete(path: Path, spec: ShardSpec, job: _Job) -> bool:
    """Whether `path` is shard `spec` of this collection, whole: its header is the plan's
    and every tensor's bytes hash to what its header records (a damaged shard is computed
    again)."""
    if not path.is_file():
        return False
    try:
        layout = shard_layout(job.manifest, spec)
        MappedShard(path, spec, job.digest, layout).check_all()
    except (StoreError, OSError):
        return False
    return True


def _run(model: Any, job: _Job, todo: list[ShardSpec], writer: ShardWriter, bar: Any) -> None:
    captured: dict[str, Tensor] = {}
    # The hook keeps a reference only: nothing edits activations in place in the forward.
    keep = lambda x, hook: captured.__setitem__(hook.name, x)
    try:
        with torch.inference_mode(), model.hooks([(n, keep) for n in job.names]):
            for spec in todo:
                writer.begin(spec)
                for start in range(spec.start, spec.stop, job.batch_size):
                    tokens = job.packed.contexts(start, min(start + job.batch_size, spec.stop))
                    device_tokens = tokens.to(model.cfg.device)
                    model(device_tokens, return_type=None, stop_at_layer=job.stop_at)
                    rows = {n: _as_rows(n, captured.pop(n)) for n in job.names}
                    writer.add(rows, tokens.to(torch.int32))
                    bar.update(tokens.numel())
                writer.end()
        writer.close()
    finally:
        writer.abort()  # a no-op after close(); after an error, no thread is left waiting
        bar.close()


class _NoWriter:
    """A `ShardWriter` that writes nothing: a tensor-parallel rank other than 0 runs the
    forwards with rank 0 and leaves the writing to it."""

    def begin(self, spec: ShardSpec) -> None:
        """Nothing to open."""

    def add(self, activations: dict[str, Tensor], tokens: Tensor) -> None:
        """Nothing to queue."""

    def end(self) -> None:
        """Nothing to commit."""

    def close(self) -> None:
        """Nothing to wait for."""

    def abort(self) -> None:
        """Nothing to stop."""


def _as_rows(name: str, activation: Tensor) -> Tensor:
    """`[batch pos *feature]` → `[row *feature]`, rows context after context (query positions
    for attention patterns and scores)."""
    activation = activation.movedim(_names.pos_axis(name), 1)
    return activation.reshape(-1, *activation.shape[2:]).cpu()


def _stop_layer(full_names: list[str], n_layers: int) -> int | None:
    """The first block no name needs (the forward stops there), or None for the whole model."""
    needed = []
    for name in full_names:
        layer = _names.layer_of(name)
        if layer is not None:
            needed.append(layer + 1)
        elif name in ("hook_embed", "hook_pos_embed"):
            needed.append(0)
        else:
            return None
    return max(needed)


def _row_shapes(
    model: Any, packed: PackedContexts, full_names: list[str], stop_at: int | None
) -> dict[str, tuple[int, ...]]:
    seen: dict[str, tuple[int, ...]] = {}
    keep = lambda x, hook: seen.__setitem__(hook.name, tuple(_as_rows(hook.name, x).shape[1:]))
    with torch.inference_mode(), model.hooks([(n, keep) for n in full_names]):
        model(packed.contexts(0, 1).to(model.cfg.device), return_type=None, stop_at_layer=stop_at)
    return {n: seen[n] for n in full_names}


def _plan(
    model: Any,
    full_names: list[str],
    dtype: torch.dtype,
    packed: PackedContexts,
    batch_size: int,
    shard_contexts: int,
    row_shapes: dict[str, tuple[int, ...]],
) -> dict[str, Any]:
    """Everything that decides the shards' bytes (its digest is the fingerprint)."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "model": {
            "name": model.cfg.model_name,
            "weights_sha256": weights_sha256(model),
            "config": json.loads(json.dumps(model.cfg.to_dict(), default=str)),
        },
        "names": full_names,
        "dtype": str(dtype).removeprefix("torch."),
        "row_shapes": {n: list(s) for n, s in row_shapes.items()},
        "axes": {n: list(_row_axes(n)) for n in full_names},
        "rows_per_context": packed.packing.context,
        "packing": packed.packing.to_dict(),
        "batch_size": batch_size,
        "shard_contexts": shard_contexts,
        "torch_version": torch.__version__,
    }


def _row_axes(name: str) -> tuple[str, ...]:
    axes = list(_names.axis_names(name))
    if not axes:
        return ()
    pos = _names.pos_axis(name)
    return ("row", *[a for i, a in enumerate(axes) if i not in (0, pos)])


def _prepare_folder(out: Path, digest: str, overwrite: bool) -> None:
    """Make `out` ready for the collection `digest`: refuse a folder holding anything
    else (unless `overwrite`) before touching any file in it, then remove what a killed
    writer left (`stale_temporary_files`: never a live writer's file in flight)."""
    if out.exists() and not out.is_dir():
        raise StoreError(f"{out} exists and is not a folder")
    out.mkdir(parents=True, exist_ok=True)
    ours = [*out.glob("shard-*.safetensors"), *out.glob("stats.safetensors")]
    temporary = {p for p in out.glob(".*.tmp-*")}
    resuming = False
    if (out / MANIFEST_FILE).is_file():
        try:
            previous = read_manifest(out)
        except StoreError as error:
            if not overwrite:
                raise StoreError(
                    f"{out} holds a store that cannot be read ({error}); pass overwrite=True "
                    f"(--overwrite) to replace it, or choose another folder"
                ) from None
        else:
            resuming = previous["fingerprint"] == digest
            if not resuming and not overwrite:
                raise StoreError(
                    f"{out} holds another collection (model {previous['model']['name']!r}, "
                    f"names {previous['names']}, {previous['packing']['n_contexts']} contexts, "
                    f"fingerprint {previous['fingerprint'][:12]}); pass overwrite=True "
                    f"(--overwrite) or choose another folder"
                )
    elif any(p for p in out.iterdir() if p not in ours and p not in temporary) and not overwrite:
        raise StoreError(f"{out} is not empty and not an activation store: choose another folder")
    for stale in stale_temporary_files(out):
        stale.unlink(missing_ok=True)
    if overwrite and not resuming:
        for path in [*ours, out / MANIFEST_FILE]:
            path.unlink(missing_ok=True)


def _finish(
    out: Path, manifest: dict, shards: list[ShardSpec], full_names: list[str], dtype: torch.dtype
) -> None:
    """Rank 0, every shard in: check each shard's header, write the statistics, and commit
    the complete manifest with each shard's size and its tensors' dtypes, shapes and
    SHA-256 (as their headers record them)."""
    records, mapped, infinities = [], [], dict.fromkeys(full_names, 0)
    for spec in shards:
        path = out / spec.file
        _, record, _, _ = read_header(path)
        if record.get("fingerprint") != manifest["fingerprint"]:
            raise StoreError(
                f"{path} was computed for another collection than rank 0's (fingerprint "
                f"{str(record.get('fingerprint'))[:12]}, expected {manifest['fingerprint'][:12]}): "
                f"every rank must see the same model, inputs and arguments (on several nodes: "
                f"the same files and the same Python, whose stdlib is the default corpus)"
            )
        layout = shard_layout(manifest, spec)
        shard = MappedShard(path, spec, manifest["fingerprint"], layout)
        for name, count in shard.infinities.items():
            infinities[name] = infinities.get(name, 0) + count
        tensors = {key: layout[key].record(shard.sha256[key]) for key in layout}
        records.append({**spec.to_dict(), "bytes": path.stat().st_size, "tensors": tensors})
        mapped.append(shard)
    stats_bytes, stats_sha256 = write_stats(out, mapped, full_names)
    final = {
        **manifest,
        "status": "complete",
        "shards": records,
        "infinities": infinities,
        "stats_bytes": stats_bytes,
        "stats_sha256": stats_sha256,
    }
    write_manifest(out, final)
    overflowed = {n: c for n, c in infinities.items() if c}
    if overflowed:
        warnings.warn(
            f"storing as {dtype} overflowed: {overflowed} values became infinite that were "
            f"finite in the model (largest {dtype} is {torch.finfo(dtype).max:.4g}); collect "
            f"these names as bfloat16 or float32",
            RuntimeWarning,
            stacklevel=3,
        )


def _disk_error(error: OSError, out: Path, shards: list[ShardSpec]) -> OSError:
    if error.errno != errno.ENOSPC:
        return error
    complete = sum((out / s.file).is_file() for s in shards)
    return OSError(
        errno.ENOSPC,
        f"no space left on the device while writing to {out}: {complete} of {len(shards)} "
        f"shards are complete and readable (ActivationStore opens them as a store in "
        f"progress); free some space and rerun the same collection to write the rest",
    )


def _bar(todo: list[ShardSpec], ranks: _distributed.RankInfo, progress: bool) -> Any:
    total = sum(s.rows[1] - s.rows[0] for s in todo)
    desc = "collecting" if ranks.world_size == 1 else f"rank {ranks.rank}/{ranks.world_size}"
    return tqdm(
        total=total,
        unit="tok",
        unit_scale=True,
        desc=desc,
        disable=not progress or not ranks.is_main,
    )
