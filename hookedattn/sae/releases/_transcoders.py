"""`TranscoderSet.from_pretrained(name)`: the transcoders of a circuit-tracer set from the
hub, by repo id or by one of circuit-tracer's preset names, fetching only the files its
`config.yaml` lists.

A name is a preset (`"gemma"`: `mwhanna/gemma-scope-transcoders`, Gemma Scope's transcoders
for Gemma 2 2B; `"llama"`: `mntss/transcoder-Llama-3.2-1B`; as circuit-tracer resolves them,
plus those `register_transcoder_preset` adds) or, as circuit-tracer reads it,
`org/repo[/folder][@revision]` (or `hf://org/repo/folder?revision=...`).

The repo's `config.yaml` says what the set is (`hookedattn.sae._circuit_tracer_io`):
`model_kind: cross_layer_transcoder` is a folder of `W_enc_{l}` / `W_dec_{l}` files (all
fetched); a per-layer set lists its files, each a path in the repo or an `hf://` URI of
another repo's file (fetched from there, at the URI's revision, with the same token and
cache), or lists none, and its `layer_{L}.safetensors` are fetched.
"""

import dataclasses
import difflib
import urllib.parse
from pathlib import Path
from typing import Any

from hookedattn.core.hub import HubOptions, snapshot
from hookedattn.sae import _circuit_tracer_io, _transcoder_io
from hookedattn.sae.cross_layer import CrossLayerTranscoder
from hookedattn.sae.releases import _shared
from hookedattn.sae.transcoder import Transcoder

# circuit-tracer's presets (`circuit_tracer.utils.hf_utils.load_transcoder_from_hub`).
PRESETS = {"gemma": "mwhanna/gemma-scope-transcoders", "llama": "mntss/transcoder-Llama-3.2-1B"}
_REGISTERED: dict[str, str] = {}
CONFIG = _transcoder_io.YAML_FILE


def transcoder_presets() -> dict[str, str]:
    """circuit-tracer's preset names (and those registered here), each with its repo."""
    return {**PRESETS, **_REGISTERED}


def register_transcoder_preset(name: str, repo: str, *, replace: bool = False) -> None:
    """Name a transcoder set in this process (`repo`: `org/repo[/folder][@revision]`); a name
    circuit-tracer already uses needs `replace=True`. `unregister_transcoder_preset` undoes
    it."""
    if not isinstance(name, str) or not name or "/" in name:
        raise ValueError(f"a preset name is a non-empty str without '/', got {name!r}")
    _parse(repo)  # a repo id that cannot be read is refused now, not at load
    if name in transcoder_presets() and not replace:
        raise ValueError(
            f"preset {name!r} exists ({transcoder_presets()[name]}); pass replace=True to "
            f"replace it in this process"
        )
    _REGISTERED[name] = repo


def unregister_transcoder_preset(name: str) -> None:
    """Remove a preset `register_transcoder_preset` added (circuit-tracer's come back)."""
    if name not in _REGISTERED:
        raise KeyError(f"no preset {name!r} was registered here; registered: {sorted(_REGISTERED)}")
    del _REGISTERED[name]


def load(
    name: str, options: HubOptions, device: Any, dtype: Any
) -> list[Transcoder] | CrossLayerTranscoder:
    """The transcoders of the set `name` names (module docstring), fetched with `options`:
    one per layer, or a cross-layer transcoder (what `TranscoderSet` takes)."""
    _shared.torch_dtype(dtype)
    repo_id, folder, revision = _parse(transcoder_presets().get(name, name))
    if revision is not None:
        if options.revision not in (None, revision):
            raise ValueError(
                f"{name!r} names revision {revision!r} and revision={options.revision!r} was "
                f"passed: give one"
            )
        options = dataclasses.replace(options, revision=revision)
    config_file = _shared.in_repo(repo_id, folder, CONFIG)
    snap = snapshot(repo_id, [_shared.literal(config_file)], options)
    what = f"transcoder set {name!r} (circuit-tracer's layout: a {CONFIG})"
    _shared.require(snap, [config_file], repo_id, options, what)
    raw = _transcoder_io.read_yaml(snap / config_file)
    if raw.get("model_kind") == "cross_layer_transcoder":
        patterns = [_shared.literal(_shared.in_repo(repo_id, folder, "")) + p
                    for p in ("W_enc_*.safetensors", "W_dec_*.safetensors")]  # fmt: skip
        snap = snapshot(repo_id, patterns, options)
        return _shared.place(CrossLayerTranscoder.load(snap / folder), device, dtype)
    config = _circuit_tracer_io.parse_config(raw, snap / config_file)
    files = _layer_files(repo_id, folder, config, options)
    return [
        _shared.place(_circuit_tracer_io.read_layer(Transcoder, files[layer], layer, config),
                       device, dtype)
        for layer in sorted(files)
    ]  # fmt: skip


def _layer_files(
    repo_id: str, folder: str, config: _circuit_tracer_io.SetConfig, options: HubOptions
) -> dict[int, Path]:
    """Each layer's file, fetched: the repo's `layer_{L}.safetensors` when the config lists
    none, else the listed files (this repo's in one snapshot, other repos' each from its own)."""
    if config.files is None:
        pattern = _shared.literal(_shared.in_repo(repo_id, folder, "")) + "layer_*.safetensors"
        snap = snapshot(repo_id, [pattern], options)
        found = _circuit_tracer_io.layer_files(snap / folder)
        return {layer: snap / folder / name for layer, name in found.items()}
    out: dict[int, Path] = {}
    local = {}
    for layer, ref in config.files.items():
        if ref.startswith(_circuit_tracer_io.HUB_PREFIX):
            out[layer] = _fetch_uri(ref, options)
        else:
            local[layer] = _shared.in_repo(repo_id, folder, ref)
            _circuit_tracer_io.inside(Path(folder), ref)  # no '..', not absolute
    if local:
        snap = snapshot(repo_id, [_shared.literal(p) for p in local.values()], options)
        _shared.require(snap, list(local.values()), repo_id, options, f"{repo_id}'s {CONFIG}")
        out |= {layer: snap / path for layer, path in local.items()}
    return out


def _fetch_uri(uri: str, options: HubOptions) -> Path:
    """The file an `hf://org/repo/path?revision=...` URI names, fetched from its repo."""
    repo_id, path, revision = _parse(uri)
    if not path:
        raise ValueError(f"{uri} names a repo, not a file in it")
    theirs = dataclasses.replace(options, revision=revision)
    snap = snapshot(repo_id, [_shared.literal(path)], theirs)
    _shared.require(snap, [path], repo_id, theirs, f"the file {uri}")
    return snap / path


def _parse(name: str) -> tuple[str, str, str | None]:
    """`(repo_id, folder or file in it, revision)` from `org/repo[/path][@revision]` or
    `hf://org/repo/path?revision=...` (circuit-tracer's two spellings)."""
    if not isinstance(name, str):
        raise TypeError(f"a transcoder set is named by a str, got {name!r}")
    revision = None
    if name.startswith("hf://"):
        parsed = urllib.parse.urlparse(name)
        revision = urllib.parse.parse_qs(parsed.query).get("revision", [None])[0] or None
        name = parsed.netloc + parsed.path
    elif "@" in name:
        name, revision = name.split("@", 1)
    parts = name.strip("/").split("/")
    if len(parts) < 2 or not all(parts[:2]):
        presets = transcoder_presets()
        close = difflib.get_close_matches(name, list(presets), n=3, cutoff=0.5)
        hint = f" (close: {', '.join(close)})" if close else ""
        raise KeyError(
            f"{name!r} is neither a transcoder preset{hint} nor a hub repo id 'org/repo'; "
            f"presets: {', '.join(f'{k} ({v})' for k, v in presets.items())}"
        )
    return "/".join(parts[:2]), "/".join(parts[2:]), revision
