"""The store's layout on disk and its manifest, the record that commits it.

    acts/
      manifest.json            what was collected, how, and which shards hold which rows
      shard-00000.safetensors  rows of contexts 0..S-1: one tensor per hook name, the tokens,
      shard-00001.safetensors  and that shard's running statistics
      ...
      stats.safetensors        the statistics of every row (a complete store)

Shard `k` holds contexts `k*S .. (k+1)*S` (S = `shard_contexts`), whoever computed it, so a
collection on any number of ranks writes the same files. The manifest is written when a
collection starts (`status: "writing"`) and rewritten when the last shard is in
(`"complete"`), then recording for each shard its size and, for each of its tensors, the
dtype, shape and SHA-256 of its bytes (which the shard's own header records too), and the
SHA-256 of `stats.safetensors`.

What decides the shards' bytes (`PLAN_FIELDS`) is digested into the fingerprint; reading a
manifest digests them again, so a manifest edited by hand (`rows_per_context`, a shard
record deleted, `contexts` swapped) is refused by name, as is one missing a field.
"""

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

import safetensors.torch

from hookedattn.core import parallel
from hookedattn.store._files import commit, temporary_name

FORMAT = "hookedattn-activation-store"
# 2: content hashes in every shard header and in the complete manifest.
VERSION = 2
MANIFEST_FILE = "manifest.json"
STATS_PREFIX = "__stats__."
TOKENS_KEY = "tokens"
STORE_DTYPES = ("float32", "float16", "bfloat16", "float64")
# The fields of a manifest that decide the bytes of the shards: their digest is the
# fingerprint, which every shard's header carries.
PLAN_FIELDS = (
    "format",
    "version",
    "model",
    "names",
    "dtype",
    "row_shapes",
    "axes",
    "rows_per_context",
    "packing",
    "batch_size",
    "shard_contexts",
    "torch_version",
)


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


def weights_sha256(model: Any) -> str:
    """SHA-256 of the model's state dict as safetensors bytes (names, dtypes, shapes, values);
    a tensor-parallel model's whole one (gathered: every rank must call this), so that it
    hashes as the same model in one process does."""
    split = getattr(model, "tp", None) is not None
    state = parallel.full_state_dict(model) if split else model.state_dict()
    tensors = {n: t.detach().contiguous().cpu() for n, t in state.items()}
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
    """A digest of everything that decides the bytes of the shards (`PLAN_FIELDS`)."""
    return hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()


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
    """The manifest of the store in `folder`, checked: format and version, every field
    present with its type, the fingerprint of the plan fields, and the shard records.
    A `StoreError` names what is wrong."""
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
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        problem = "nested too deeply" if isinstance(error, RecursionError) else error
        raise StoreError(f"{path} is not valid JSON ({problem}): not a readable store") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        got = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        raise StoreError(
            f"{path} is not an activation-store manifest: format {got!r}, expected {FORMAT!r}"
        )
    if manifest.get("version") != VERSION:
        older = manifest.get("version") == 1
        raise StoreError(
            f"{path} was written by format version {manifest.get('version')!r}"
            f"{' (no content hashes, so its shards cannot be verified)' if older else ''}; "
            f"this hookedattn reads version {VERSION}: collect the store again with this "
            f"version (collect_activations(..., overwrite=True), or into another folder)"
        )
    check_manifest(manifest, path)
    return manifest


# ---------------------------------------------------------------------- the shards' layout
_CODES = {"float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16"}


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One tensor of a shard as its header must describe it: safetensors `dtype` code
    ("F32", "I32", ...) and `shape`."""

    dtype: str
    shape: tuple[int, ...]

    def record(self, sha256: str) -> dict[str, Any]:
        """The manifest's record of the tensor, with the SHA-256 of its bytes."""
        return {"dtype": self.dtype, "shape": list(self.shape), "sha256": sha256}


def shard_layout(manifest: dict[str, Any], spec: ShardSpec) -> dict[str, TensorSpec]:
    """Every tensor shard `spec` holds under this manifest's plan: each name's rows
    `[row *row_shape]` in the store dtype, the tokens `[context pos]` as int32, and each
    name's running mean and M2 `[*row_shape]` in float64."""
    n_contexts = spec.stop - spec.start
    code = _CODES[manifest["dtype"]]
    layout = {}
    for name in manifest["names"]:
        row_shape = tuple(manifest["row_shapes"][name])
        layout[name] = TensorSpec(code, (n_contexts * spec.rows_per_context, *row_shape))
        layout[f"{STATS_PREFIX}{name}.mean"] = TensorSpec("F64", row_shape)
        layout[f"{STATS_PREFIX}{name}.m2"] = TensorSpec("F64", row_shape)
    layout[TOKENS_KEY] = TensorSpec("I32", (n_contexts, spec.rows_per_context))
    return layout


def shard_specs(manifest: dict[str, Any]) -> list[ShardSpec]:
    """The shards the manifest's plan makes (its `shards` records are checked against them)."""
    n_contexts = manifest["packing"]["n_contexts"]
    return plan_shards(n_contexts, manifest["shard_contexts"], manifest["rows_per_context"])


# ---------------------------------------------------------------------- checking a manifest
def _count(value: Any, low: int = 0) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= low


def _sha256(value: Any) -> bool:
    return (
        isinstance(value, str) and len(value) == 64 and all(c in "0123456789abcdef" for c in value)
    )


def _map_of(value: Any, check: Any) -> bool:
    return isinstance(value, dict) and all(
        isinstance(k, str) and check(v) for k, v in value.items()
    )


def _list_of(value: Any, check: Any) -> bool:
    return isinstance(value, list) and all(check(v) for v in value)


def _is_packing(value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    return _count(value.get("context"), 2) and _count(value.get("n_contexts"), 1)


def _is_model(value: Any) -> bool:
    if not isinstance(value, dict) or not isinstance(value.get("config"), dict):
        return False
    return isinstance(value.get("name"), str | None) and _sha256(value.get("weights_sha256"))


_FIELDS: dict[str, tuple[Any, str]] = {
    "fingerprint": (_sha256, "a SHA-256 hex digest"),
    "status": (lambda v: v in ("writing", "complete"), "'writing' or 'complete'"),
    "names": (
        lambda v: _list_of(v, lambda n: isinstance(n, str)) and 0 < len(v) == len(set(v)),
        "a non-empty list of distinct hook names",
    ),
    "dtype": (lambda v: v in STORE_DTYPES, f"one of {', '.join(STORE_DTYPES)}"),
    "row_shapes": (lambda v: _map_of(v, lambda s: _list_of(s, _count)), "hook name -> row shape"),
    "axes": (
        lambda v: _map_of(v, lambda a: _list_of(a, lambda x: isinstance(x, str))),
        "hook name -> axis names",
    ),
    "rows_per_context": (lambda v: _count(v, 2), "an int >= 2"),
    "packing": (_is_packing, "a record with ints context >= 2 and n_contexts >= 1"),
    "batch_size": (lambda v: _count(v, 1), "a positive int"),
    "shard_contexts": (lambda v: _count(v, 1), "a positive int"),
    "model": (_is_model, "a record with the model's name, weights_sha256 and config"),
    "torch_version": (lambda v: isinstance(v, str), "a string"),
    "shards": (lambda v: _list_of(v, lambda r: isinstance(r, dict)), "a list of shard records"),
}
_COMPLETE_FIELDS: dict[str, tuple[Any, str]] = {
    "infinities": (lambda v: _map_of(v, _count), "hook name -> count"),
    "stats_bytes": (lambda v: _count(v, 1), "a positive int"),
    "stats_sha256": (_sha256, "a SHA-256 hex digest"),
}


def check_manifest(manifest: dict[str, Any], path: Path) -> None:
    """Refuse a manifest that is not the one a collection wrote: a field missing or of the
    wrong type, plan fields that no longer digest to the fingerprint, shard records that
    are not the plan's shards (one deleted, contexts swapped), or, complete, a shard
    record without its size and tensors."""
    remedy = "collect the store again (overwrite=True, or another folder)"
    fields = {**_FIELDS, **(_COMPLETE_FIELDS if manifest.get("status") == "complete" else {})}
    problems = [
        f"{field} is {'missing' if field not in manifest else repr(manifest[field])[:80]}, "
        f"expected {expected}"
        for field, (check, expected) in fields.items()
        if field not in manifest or not check(manifest[field])
    ]
    if not problems:
        names = set(manifest["names"])
        problems = [
            f"{field} describes {sorted(manifest[field])}, not the names {sorted(names)}"
            for field in ("row_shapes", "axes")
            if set(manifest[field]) != names
        ]
        if manifest["packing"]["context"] != manifest["rows_per_context"]:
            problems.append(
                f"rows_per_context={manifest['rows_per_context']} is not the packing's "
                f"context {manifest['packing']['context']}"
            )
    if problems:
        raise StoreError(f"{path} is damaged or was edited: {'; '.join(problems)}; {remedy}")
    plan = {field: manifest[field] for field in PLAN_FIELDS}
    if fingerprint(plan) != manifest["fingerprint"]:
        raise StoreError(
            f"{path} was edited after it was written: its fields {', '.join(PLAN_FIELDS[2:])} "
            f"no longer digest to its fingerprint {manifest['fingerprint'][:12]} (they digest "
            f"to {fingerprint(plan)[:12]}), so its shards may not be what it describes; {remedy}"
        )
    _check_shard_records(manifest, path, remedy)


def _check_shard_records(manifest: dict[str, Any], path: Path, remedy: str) -> None:
    specs, records = shard_specs(manifest), manifest["shards"]
    if len(records) != len(specs):
        raise StoreError(
            f"{path} lists {len(records)} shard records, but its "
            f"{manifest['packing']['n_contexts']} contexts in shards of "
            f"{manifest['shard_contexts']} make {len(specs)}: a record was deleted or added; "
            f"{remedy}"
        )
    complete = manifest["status"] == "complete"
    for spec, record in zip(specs, records, strict=True):
        expected = spec.to_dict()
        if complete:
            layout = shard_layout(manifest, spec)
            tensors = record.get("tensors")
            wrong_tensors = not isinstance(tensors, dict) or set(tensors) != set(layout)
            if not wrong_tensors:
                wrong_tensors = any(
                    not isinstance(tensors[k], dict) or not _sha256(tensors[k].get("sha256"))
                    or tensors[k] != layout[k].record(tensors[k]["sha256"])
                    for k in layout
                )  # fmt: skip
            if wrong_tensors or not _count(record.get("bytes"), 1):
                raise StoreError(
                    f"{path}: the record of shard {spec.index} lacks its size or the dtype, "
                    f"shape and SHA-256 of each of its tensors {sorted(layout)}; {remedy}"
                )
        differ = [key for key, value in expected.items() if record.get(key) != value]
        if differ:
            shown = {key: record.get(key) for key in differ}
            raise StoreError(
                f"{path}: shard record {spec.index} says {shown}, but the plan puts "
                f"{ {key: expected[key] for key in differ} } there (records reordered or "
                f"edited); {remedy}"
            )
