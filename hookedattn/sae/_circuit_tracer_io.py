"""circuit-tracer's per-layer transcoder sets: a `config.yaml` and one file per layer.

The `config.yaml` names `feature_input_hook` and `feature_output_hook` (hooks within a
block, circuit-tracer's names: `hookedattn.sae._circuit_tracer_names` maps them to ours),
the model, and the layers' files, in one of circuit-tracer's two schemas, which are told
apart by the config (the layer files hold the same tensor names in both, and no metadata):

- circuit-tracer 0.5's (from 0.2 on, and what `save_transcoder_set` writes): `model_kind:
  transcoder_set`, and `transcoders` a list of files (layer `i` the `i`-th) or no list, the
  files being `layer_{L}.safetensors` beside the config (what circuit-tracer's cache holds,
  read by `load_transcoders_from_cache`); `activation` may say `relu`, `jumprelu` or `topk`.
  A layer's file is what `SingleLayerTranscoder.to_safetensors` writes: `W_enc [d_sae
  d_in]`, `W_dec [d_sae d_out]`, `b_enc [d_sae]`, `b_dec [d_out]`, `W_skip [d_out d_in]` for
  a skip transcoder, `activation_function.threshold [d_sae]` for a JumpReLU one.
- the first (circuit-tracer's configs before 0.2): no `model_kind`; `transcoders` a list
  of `{id, layer, filepath}`. Its files hold the same tensors with `W_dec [d_out d_sae]`
  (that version transposed it on load).

A `W_dec` of the other schema's shape is refused, not transposed back on a guess (a square
one could not be told). A file is `hf://org/repo/path?revision=...` (another repo's:
`TranscoderSet.from_pretrained` fetches it) or a path in the set's own folder; besides
safetensors, Gemma Scope's `params.npz` (the "gemma" set lists them): `W_enc [d_in d_sae]`,
`W_dec [d_sae d_out]`, `b_enc`, `b_dec`, `threshold`, a JumpReLU transcoder as Gemma Scope
computes it (ours).

circuit-tracer's JumpReLU passes `pre` where `pre > threshold`, ours `relu(pre)` there
(SAELens's): the same for thresholds >= 0, so a negative one is refused on reading and
written as 0 (the same function). Its TopK keeps negative values among the top k, ours does
not: refused. Everything a file says is checked before anything is allocated from it
(`_strict`).
"""

import dataclasses
import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

import safetensors.torch
import torch

from hookedattn.sae import _circuit_tracer_names as _names
from hookedattn.sae import _npz, _strict
from hookedattn.sae._transcoder_io import YAML_FILE, fill, read_yaml
from hookedattn.sae.transcoder_config import TranscoderConfig

HUB_PREFIX = "hf://"
_THRESHOLD = "activation_function.threshold"
_GEMMA_SCOPE = ("W_enc", "W_dec", "b_enc", "b_dec", "threshold")
# The two schemas (module docstring): how each stores `W_dec`.
CURRENT = "circuit-tracer 0.5's schema (model_kind: transcoder_set)"
FIRST = "circuit-tracer's first schema (no model_kind, transcoders listed with their layers)"
_DECODER = {CURRENT: "d_sae d_out", FIRST: "d_out d_sae"}


@dataclasses.dataclass(frozen=True)
class SetConfig:
    """What a set's `config.yaml` says: the hooks within a block (ours), each layer's file
    (None: `layer_{L}.safetensors` beside the config), its schema (`CURRENT` or `FIRST`,
    which fixes how `W_dec` is stored), and the activation it names (None: read off each
    file)."""

    hook_in: str
    hook_out: str
    files: dict[int, str] | None
    schema: str
    activation: str | None = None


# ---------------------------------------------------------------------- writing
def save_transcoder_set(
    transcoders: list[Any], path: str | Path, model_name: str = "", scan: str | None = None
) -> Path:
    """Write per-layer ReLU or JumpReLU transcoders (skip or not) for layers `0..n-1` in
    circuit-tracer 0.5's layout (module docstring): `layer_{L}.safetensors` per layer and a
    `config.yaml` with `model_kind: transcoder_set`, `model_name`, the hooks in circuit-
    tracer's names and `scan` (when given)."""
    path = Path(path)
    first = _check_writable(transcoders)
    path.mkdir(parents=True, exist_ok=True)
    for tc in transcoders:
        tensors = {
            "W_enc": tc.W_enc.detach().T.contiguous(),
            "W_dec": tc.W_dec.detach().contiguous().clone(),
            "b_enc": tc.b_enc.detach().clone(),
            "b_dec": tc.b_dec.detach().clone(),
        }
        if tc.cfg.activation == "jumprelu":
            # Below 0 ours and circuit-tracer's differ, and ours with a threshold t < 0 is
            # circuit-tracer's with 0 (module docstring).
            tensors[_THRESHOLD] = tc.activation.threshold.detach().clamp(min=0)
        if tc.cfg.skip:
            tensors["W_skip"] = tc.W_skip.detach().clone()
        safetensors.torch.save_file(tensors, str(path / f"layer_{tc.cfg.layer}.safetensors"))
    config = {
        "model_kind": _names.PER_LAYER,
        "model_name": model_name,
        "feature_input_hook": _names.theirs(_names.within_block(first.hook_name)),
        "feature_output_hook": _names.theirs(_names.within_block(first.hook_name_out)),
        **({"scan": scan} if scan else {}),
    }
    (path / YAML_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return path


def _check_writable(transcoders: list[Any]) -> TranscoderConfig:
    """What circuit-tracer's `TranscoderSet` requires of its transcoders (or a `ValueError`
    saying what differs): layers `0..n-1`, one hook pair, one `d_sae`, `d_in == d_out`
    (its `d_model`), ReLU or JumpReLU."""
    if not transcoders:
        raise ValueError("save_transcoder_set needs at least one transcoder")
    layers = [tc.cfg.layer for tc in transcoders]
    if sorted(layers, key=lambda x: -1 if x is None else x) != list(range(len(layers))):
        raise ValueError(
            f"circuit-tracer's set has one transcoder per layer 0..n-1; these are for layers "
            f"{layers}"
        )
    by_layer = sorted(zip(layers, transcoders, strict=True), key=lambda pair: pair[0])
    first = by_layer[0][1].cfg
    hooks = (_names.within_block(first.hook_name), _names.within_block(first.hook_name_out))
    for layer, tc in by_layer:
        c = tc.cfg
        if c.activation not in ("relu", "jumprelu"):
            raise ValueError(
                f"circuit-tracer's per-layer files hold ReLU or JumpReLU transcoders; the one at "
                f"layer {layer} is {c.activation}: save it in SAELens's layout (tc.save(folder))"
            )
        if c.d_in != c.d_out:
            raise ValueError(
                f"circuit-tracer's transcoders map d_model to d_model; the one at layer {layer} "
                f"maps d_in={c.d_in} to d_out={c.d_out}"
            )
        if c.d_sae != first.d_sae:
            raise ValueError(
                f"circuit-tracer's set has one d_sae; layer 0 has {first.d_sae}, layer {layer} "
                f"{c.d_sae}"
            )
        mine = (_names.within_block(c.hook_name), _names.within_block(c.hook_name_out))
        if mine != hooks:
            raise ValueError(
                f"circuit-tracer's set names one pair of hooks for every layer; layer 0 reads "
                f"and writes {hooks}, layer {layer} {mine}"
            )
    return first


# ---------------------------------------------------------------------- reading
def load_transcoder_set(cls: type, path: str | Path) -> list[Any]:
    """The per-layer transcoders (each a `cls`) of a circuit-tracer folder, by layer."""
    path = Path(path)
    config = parse_config(read_yaml(path / YAML_FILE), path / YAML_FILE)
    files = config.files if config.files is not None else layer_files(path)
    for ref in files.values():
        if ref.startswith(HUB_PREFIX):
            raise ValueError(
                f"{path / YAML_FILE} names {ref}, a file on the hub: load the set by its repo "
                f"id with TranscoderSet.from_pretrained, which fetches it"
            )
    return [read_layer(cls, inside(path, files[layer]), layer, config) for layer in sorted(files)]


def parse_config(raw: dict[str, Any], where: Path) -> SetConfig:
    """A per-layer set's `config.yaml`, checked (module docstring)."""
    hooks = [raw.get(f) for f in ("feature_input_hook", "feature_output_hook")]
    if not all(isinstance(h, str) and h for h in hooks):
        raise ValueError(f"{where} needs feature_input_hook and feature_output_hook")
    kind = raw.get("model_kind")
    if kind == _names.CROSS_LAYER:
        raise ValueError(
            f"{where}: model_kind {kind!r} is a cross-layer transcoder: load it with "
            f"CrossLayerTranscoder.load"
        )
    if kind not in (None, _names.PER_LAYER):
        raise ValueError(
            f"{where}: model_kind {kind!r} is not circuit-tracer's; it is "
            f"{_names.PER_LAYER!r} (per-layer) or {_names.CROSS_LAYER!r}"
        )
    activation = raw.get("activation")
    if activation == "topk":
        raise ValueError(
            f"{where}: activation 'topk' is circuit-tracer's TopK, which keeps negative values "
            f"among the top k; ours (SAELens's) passes them through a ReLU: not read"
        )
    if activation not in (None, "relu", "jumprelu"):
        raise ValueError(f"{where}: activation {activation!r} is not relu, jumprelu or topk")
    schema = FIRST if kind is None else CURRENT
    entries = raw.get("transcoders")
    if entries is None and schema is FIRST:
        raise ValueError(
            f"{where} has no model_kind (circuit-tracer's first schema), which lists its "
            f"transcoders: it needs a non-empty list 'transcoders' of {{id, layer, filepath}}; "
            f"circuit-tracer 0.5's says model_kind: {_names.PER_LAYER}"
        )
    files = None if entries is None else _files(entries, where, schema)
    return SetConfig(_names.ours(hooks[0]), _names.ours(hooks[1]), files, schema, activation)


def _files(entries: Any, where: Path, schema: str) -> dict[int, str]:
    """Each layer's file: the `i`-th for layer `i` (0.5's schema) or by its entry's layer
    (the first)."""
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{where}: 'transcoders' must be a non-empty list, got {entries!r}")
    wanted = "a file (a str)" if schema is CURRENT else "a mapping {id, layer, filepath}"
    files: dict[int, str] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, str if schema is CURRENT else dict):
            raise ValueError(
                f"{where}: in {schema} each transcoder is {wanted}, got {entry!r} (the schema "
                f"fixes how W_dec is stored, so the two are not mixed)"
            )
        layer, ref = (
            (i, entry) if isinstance(entry, str) else (entry.get("layer"), entry.get("filepath"))
        )
        if not isinstance(layer, int) or isinstance(layer, bool) or layer < 0:
            raise ValueError(f"{where}: each transcoder needs a layer >= 0, got {entry!r}")
        if not isinstance(ref, str) or not ref:
            raise ValueError(f"{where}: each transcoder needs a file, got {entry!r}")
        if layer in files:
            raise ValueError(f"{where} lists layer {layer} twice")
        files[layer] = ref
    if sorted(files) != list(range(len(files))):
        raise ValueError(f"{where}: layers {sorted(files)} are not 0..{len(files) - 1}")
    return files


def layer_files(folder: Path) -> dict[int, str]:
    """The `layer_{L}.safetensors` files in `folder` (which must be layers 0..n-1)."""
    found = {int(m.group(1)): p.name for p in folder.glob("layer_*.safetensors")
             if (m := re.fullmatch(r"layer_(\d+)\.safetensors", p.name))}  # fmt: skip
    if not found or sorted(found) != list(range(len(found))):
        raise ValueError(
            f"{folder} holds no layer_0.safetensors ... layer_{{n-1}}.safetensors for the set's "
            f"config.yaml, which lists no files; found layers {sorted(found)}"
        )
    return found


def inside(path: Path, name: str) -> Path:
    """The file `name` a `config.yaml` lists, which must be inside the folder `path` (a
    relative path without `..`: a folder never points a reader elsewhere)."""
    relative = PurePosixPath(name)
    if relative.is_absolute() or ".." in relative.parts or Path(name).is_absolute():
        raise ValueError(
            f"{path / YAML_FILE} names the file {name!r}, which is not a file inside {path}: "
            f"a transcoder set is read from its own folder only"
        )
    return path / relative


def read_layer(cls: type, file: Path, layer: int, config: SetConfig) -> Any:
    """Layer `layer`'s transcoder (a `cls`) from its file (module docstring)."""
    if file.suffix == ".npz":
        return _gemma_scope_layer(cls, file, layer, config)
    found = _strict.tensor_shapes(file)
    shapes = {name: shape for name, (shape, _) in found.items()}
    if len(shapes.get("W_enc", ())) != 2 or len(shapes.get("b_dec", ())) != 1:
        raise ValueError(f"{file} lacks W_enc [d_sae d_in] or b_dec [d_out]; it holds {shapes}")
    d_sae, d_in = found["W_enc"][0]
    (d_out,) = found["b_dec"][0]
    _check_decoder(file, shapes.get("W_dec"), d_sae, d_out, config.schema)
    odd = {"log_thresholds", "threshold"} & set(found)
    if odd:
        raise ValueError(
            f"{file} holds {sorted(odd)}: not circuit-tracer's JumpReLU ({_THRESHOLD}), not "
            f"read (as ReLU it would be silently wrong)"
        )
    jumprelu = _THRESHOLD in found
    if config.activation is not None and config.activation != ("jumprelu" if jumprelu else "relu"):
        raise ValueError(
            f"{file}: the set's config says activation {config.activation!r}, and the file "
            f"{'holds' if jumprelu else 'lacks'} {_THRESHOLD}"
        )
    skip = "W_skip" in found
    features_first = _DECODER[config.schema] == "d_sae d_out"
    expected = {"W_enc": (d_sae, d_in), "b_enc": (d_sae,),
                "W_dec": (d_sae, d_out) if features_first else (d_out, d_sae), "b_dec": (d_out,),
                **({"W_skip": (d_out, d_in)} if skip else {}),
                **({_THRESHOLD: (d_sae,)} if jumprelu else {})}  # fmt: skip
    sizes = f"W_enc's d_sae={d_sae}, d_in={d_in} and b_dec's d_out={d_out}"
    _strict.check_tensors(file, found, expected, None, sizes)
    dtype = _strict.one_dtype(file, found)
    t = _strict.load_finite(file, list(expected))
    if jumprelu:
        t["threshold"] = _non_negative(file, t.pop(_THRESHOLD))
    t["W_enc"] = t["W_enc"].T
    t["W_dec"] = t["W_dec"] if features_first else t["W_dec"].T
    activation = "jumprelu" if jumprelu else "relu"
    return _build(cls, t, layer, config, activation, skip, dtype)


def _check_decoder(
    file: Path, shape: tuple[int, ...] | None, d_sae: int, d_out: int, schema: str
) -> None:
    """`W_dec` stored as the set's schema stores it (module docstring), or a `ValueError`
    that names the schema and, for the other schema's shape, says so."""
    layout = _DECODER[schema]
    wanted = (d_sae, d_out) if layout == "d_sae d_out" else (d_out, d_sae)
    if shape == wanted:
        return
    other = next(s for s in _DECODER if s is not schema)
    hint = (
        f"; that is how {other} stores it: the file and its config.yaml disagree"
        if shape == wanted[::-1]
        else ""
    )
    raise ValueError(
        f"{file}: W_dec has shape {shape}; the set's config.yaml is {schema}, which stores "
        f"W_dec [{layout}] = {wanted} for W_enc's d_sae={d_sae} and b_dec's d_out={d_out}{hint}"
    )


def _gemma_scope_layer(cls: type, file: Path, layer: int, config: SetConfig) -> Any:
    found = _npz.headers(file)
    if set(found) != set(_GEMMA_SCOPE) or len(found["W_enc"][0]) != 2:
        raise ValueError(
            f"{file} is not a Gemma Scope transcoder: it holds {sorted(found)}, expected "
            f"{sorted(_GEMMA_SCOPE)} with W_enc [d_in d_sae]"
        )
    d_in, d_sae = found["W_enc"][0]
    (d_out,) = found["b_dec"][0] if len(found["b_dec"][0]) == 1 else (None,)
    expected = {"W_enc": (d_in, d_sae), "W_dec": (d_sae, d_out), "b_enc": (d_sae,),
                "b_dec": (d_out,), "threshold": (d_sae,)}  # fmt: skip
    for name, shape in expected.items():
        if found[name][0] != shape:
            raise ValueError(
                f"{file}: {name} has shape {found[name][0]}, expected {shape} for W_enc's "
                f"d_in={d_in}, d_sae={d_sae} and b_dec's d_out={d_out}"
            )
    dtype = _strict.one_dtype(file, found)
    t = _npz.read(file, list(expected))
    for name, tensor in t.items():
        if not bool(tensor.isfinite().all()):
            raise ValueError(f"{file}: {name} holds NaN or infinite values")
    return _build(cls, t, layer, config, "jumprelu", False, dtype)


def _non_negative(file: Path, threshold: torch.Tensor) -> torch.Tensor:
    negative = int((threshold < 0).sum())
    if negative:
        raise ValueError(
            f"{file}: {_THRESHOLD} holds {negative} negative value(s); circuit-tracer's "
            f"JumpReLU passes pre-activations between such a threshold and 0, ours (SAELens's) "
            f"does not: not read"
        )
    return threshold


def _build(
    cls: type,
    t: dict[str, torch.Tensor],
    layer: int,
    config: SetConfig,
    activation: str,
    skip: bool,
    dtype: str,
) -> Any:
    d_in, d_sae = t["W_enc"].shape
    d_out = t["b_dec"].shape[0]
    hooks = f"blocks.{layer}.{config.hook_in}", f"blocks.{layer}.{config.hook_out}"
    cfg = TranscoderConfig(d_in, d_sae, d_out, *hooks, activation, skip=skip, dtype=dtype,
                           seed=None)  # fmt: skip
    tc = cls(cfg)
    fill(tc, t)
    return tc
