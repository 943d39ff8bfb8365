"""The release registry: SAELens's releases (shipped as `releases.json`, converted from
SAELens's `pretrained_saes.yaml` by `scripts/sae_releases.py`) and those registered in this
process (`register_sae_release`), looked up by release name and SAE id.

A lookup that fails is a `KeyError` naming the closest names (`difflib`) and how to list
them all. A name that is no release but a hub repo id (`org/name`) is read as SAELens reads
it: a repo in SAELens's folder layout, the SAE id being the folder.
"""

import dataclasses
import difflib
import functools
import json
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hookedattn.sae.releases import _naming

SHIPPED = Path(__file__).parent / "releases.json"
# The formats `SparseAutoencoder.from_pretrained` reads (others are listed, not loaded).
LOADABLE = ("saelens", "gemma_scope", "gemma_scope_2")
KINDS = ("sae", "transcoder")


@dataclasses.dataclass(frozen=True)
class ReleasedSAE:
    """One SAE of a release: where its files are (`repo_id`, `path` in the repo), in which
    `format` (`"saelens"`: `cfg.json` + `sae_weights.safetensors`; `"gemma_scope"`:
    `params.npz`; `"gemma_scope_2"`: `params.safetensors`; other names are SAELens's loaders,
    listed but not loaded here), its `kind` (`"sae"` or `"transcoder"`), the `hook` it reads
    and its `width` where the names say (None otherwise), its Neuronpedia id, the `l0`
    SAELens records, and the release's `config_overrides` (SAELens applies them to the
    SAE's config)."""

    release: str
    sae_id: str
    model: str
    repo_id: str
    path: str
    format: str = "saelens"
    kind: str = "sae"
    hook: str | None = None
    width: int | None = None
    neuronpedia: str | None = None
    l0: float | None = None
    norm_scaling_factor: float | None = None
    config_overrides: Mapping[str, Any] = dataclasses.field(
        default_factory=lambda: types.MappingProxyType({}), compare=False, repr=False
    )


@dataclasses.dataclass(frozen=True)
class _Release:
    repo_id: str
    model: str
    format: str
    kind: str
    overrides: Mapping[str, Any]
    rows: dict[str, list[Any]]  # sae id -> the JSON row (id, path, neuronpedia, l0, scale)


_REGISTERED: dict[str, _Release] = {}


@functools.cache
def _shipped_data() -> dict[str, Any]:
    return json.loads(SHIPPED.read_text())


@functools.cache
def _shipped() -> dict[str, _Release]:
    data = _shipped_data()
    if data.get("columns") != ["id", "path", "neuronpedia", "l0", "norm_scaling_factor"]:
        raise ValueError(f"{SHIPPED}: unexpected columns {data.get('columns')!r}")
    return {
        name: _Release(
            r["repo_id"],
            r["model"],
            r["format"],
            r["kind"],
            types.MappingProxyType(r.get("config_overrides", {})),
            {row[0]: row for row in r["saes"]},
        )
        for name, r in data["releases"].items()
    }


def _releases() -> dict[str, _Release]:
    return {**_shipped(), **_REGISTERED}


def _entry(name: str, release: _Release, row: list[Any]) -> ReleasedSAE:
    sae_id, path, neuronpedia, l0, scale = (row + [None] * 5)[:5]
    path = path if path is not None else sae_id
    return ReleasedSAE(
        release=name,
        sae_id=sae_id,
        model=release.model,
        repo_id=release.repo_id,
        path=path,
        format=release.format,
        kind=release.kind,
        hook=_naming.hook_name(release.format, release.repo_id, sae_id, path),
        width=_naming.width(path),
        neuronpedia=neuronpedia,
        l0=None if l0 is None else float(l0),
        norm_scaling_factor=None if scale is None else float(scale),
        config_overrides=release.overrides,
    )


def lookup(release: str, sae_id: str) -> ReleasedSAE:
    """The SAE `sae_id` of `release`; a `KeyError` names the closest release or SAE ids.
    A hub repo id that is no release is SAELens's layout, `sae_id` the folder."""
    releases = _releases()
    if not isinstance(release, str) or not isinstance(sae_id, str):
        raise TypeError(f"release and sae_id are names (str), got {release!r}, {sae_id!r}")
    if release not in releases:
        if release.count("/") == 1 and all(release.split("/")):
            return ReleasedSAE(release, sae_id, "", release, sae_id.strip("/"))
        raise _unknown(release, releases)
    entry = releases[release]
    if sae_id not in entry.rows:
        close = difflib.get_close_matches(sae_id, list(entry.rows), n=5, cutoff=0.6)
        hint = f"; close: {', '.join(close)}" if close else ""
        raise KeyError(
            f"release {release!r} has no SAE {sae_id!r}{hint}. Its {len(entry.rows)} SAE ids: "
            f"[e.sae_id for e in list_sae_releases(release={release!r})]"
        )
    return _entry(release, entry, entry.rows[sae_id])


def _unknown(release: str, releases: dict[str, _Release]) -> KeyError:
    close = difflib.get_close_matches(release, list(releases), n=5, cutoff=0.6)
    hint = f"; close: {', '.join(close)}" if close else ""
    return KeyError(
        f"no SAE release {release!r}{hint}. list_sae_releases(model=..., hook=...) lists the "
        f"{len(releases)} releases' SAEs (SAELens's names); a hub repo in SAELens's layout "
        f"loads by its id, 'org/name', with the folder as sae_id"
    )


def list_sae_releases(
    model: str | None = None, hook: str | None = None, release: str | None = None
) -> list[ReleasedSAE]:
    """The released SAEs (SAELens's registry and those registered here), by release and
    id, optionally only those of `model` (its name as the release gives it, with or without
    the org: `"gemma-2-2b"`, `"google/gemma-3-1b-pt"`; any case), reading `hook` (a full
    hook name, `"blocks.12.hook_resid_post"`), or of one `release`."""
    releases = _releases()
    if release is not None and release not in releases:
        raise _unknown(release, releases)
    out = []
    for name, entry in sorted(releases.items()):
        if release is not None and name != release:
            continue
        if model is not None and not _same_model(model, entry.model):
            continue
        entries = _shipped_entries(name) if name not in _REGISTERED else _entries(name, entry)
        out += [e for e in entries if hook is None or e.hook == hook]
    return out


def _entries(name: str, release: _Release) -> tuple[ReleasedSAE, ...]:
    return tuple(_entry(name, release, row) for row in release.rows.values())


@functools.cache
def _shipped_entries(name: str) -> tuple[ReleasedSAE, ...]:
    return _entries(name, _shipped()[name])


def _same_model(asked: str, model: str) -> bool:
    asked, model = asked.lower(), model.lower()
    return asked == model or asked.split("/")[-1] == model.split("/")[-1]


def register_sae_release(
    name: str,
    repo_id: str,
    saes: Mapping[str, str],
    *,
    model: str = "",
    format: str = "saelens",
    kind: str = "sae",
    replace: bool = False,
) -> list[ReleasedSAE]:
    """Register a release in this process: SAE ids mapped to their folders in `repo_id`
    (hook names and widths read off the names as for SAELens's releases). A name SAELens
    already uses needs `replace=True`; `unregister_sae_release(name)` undoes it. Returns the
    release's SAEs."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"a release name is a non-empty str, got {name!r}")
    if not isinstance(saes, Mapping) or not saes:
        raise ValueError(f"saes maps SAE ids to folders in {repo_id!r}, got {saes!r}")
    if format not in LOADABLE:
        raise ValueError(f"format must be one of {LOADABLE}, got {format!r}")
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if name in _releases() and not replace:
        raise ValueError(
            f"release {name!r} exists ({_releases()[name].repo_id}); pass replace=True to "
            f"replace it in this process"
        )
    rows = {str(i): [str(i), str(p).strip("/")] for i, p in saes.items()}
    _REGISTERED[name] = _Release(repo_id, model, format, kind, types.MappingProxyType({}), rows)
    return list_sae_releases(release=name)


def unregister_sae_release(name: str) -> None:
    """Remove a release `register_sae_release` added (SAELens's, if replaced, come back)."""
    if name not in _REGISTERED:
        raise KeyError(
            f"no release {name!r} was registered here; registered: {sorted(_REGISTERED)}"
        )
    del _REGISTERED[name]


def registry_source() -> dict[str, str]:
    """Where the shipped registry came from: the sae-lens version and the yaml's SHA-256."""
    return dict(_shipped_data()["source"])
