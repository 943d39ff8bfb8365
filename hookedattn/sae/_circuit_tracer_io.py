"""circuit-tracer's per-layer transcoder sets: a `config.yaml` and one file per layer.

`config.yaml` names `feature_input_hook` and `feature_output_hook` (hook names within a
block: `ln2.hook_normalized`, `hook_mlp_out`), the model, and the layers' files, in one of
circuit-tracer's two schemas:

- the first (circuit-tracer's configs of 2025, and ours): `transcoders`, a list of `{id,
  layer, filepath}`;
- the hub's (circuit-tracer 0.2 on, `model_kind: transcoder_set`): `transcoders`, a list of
  files (layer `i` the `i`-th), or no list, the files being `layer_{L}.safetensors` beside
  the config; `activation` may say `relu`, `jumprelu` or `topk`.

A file is `hf://org/repo/path?revision=...` (another repo's: `TranscoderSet.from_pretrained`
fetches it) or a path in the set's own folder. Each layer's file is one of:

- `layer_{L}.safetensors`: `W_enc [d_sae d_in]`, `b_enc`, `W_dec`, `b_dec [d_out]`, and
  `W_skip [d_out d_in]` for a skip transcoder, `activation_function.threshold [d_sae]` for a
  JumpReLU one. `W_dec` was `[d_out d_sae]` in the first schema's files (transposed on
  load) and is `[d_sae d_out]` in the hub's; the shape says which, and where `d_sae ==
  d_out` the schema does. circuit-tracer's JumpReLU passes `pre` where `pre > threshold`,
  ours `relu(pre)` there (SAELens's): the same for thresholds >= 0, so a negative one is
  refused. Its TopK keeps negative values among the top k, ours does not: refused.
- Gemma Scope's `params.npz` (the "gemma" set lists them): `W_enc [d_in d_sae]`, `W_dec
  [d_sae d_out]`, `b_enc`, `b_dec`, `threshold`, a JumpReLU transcoder as Gemma Scope
  computes it (ours).

Everything a file says is checked before anything is allocated from it (`_strict`).
"""

import dataclasses
import json
import re
from pathlib import Path, PurePosixPath
from typing import Any

import safetensors.torch
import torch

from hookedattn.sae import _npz, _strict
from hookedattn.sae._transcoder_io import YAML_FILE, fill, read_yaml
from hookedattn.sae.transcoder_config import TranscoderConfig

HUB_PREFIX = "hf://"
_THRESHOLD = "activation_function.threshold"
_GEMMA_SCOPE = ("W_enc", "W_dec", "b_enc", "b_dec", "threshold")


@dataclasses.dataclass(frozen=True)
class SetConfig:
    """What a set's `config.yaml` says: the hooks within a block, each layer's file (None:
    `layer_{L}.safetensors` beside the config), how a square `W_dec` is stored, and the
    activation it names (None: read off each file)."""

    hook_in: str
    hook_out: str
    files: dict[int, str] | None
    square_decoder: str  # "d_out d_sae" (the first schema) or "d_sae d_out" (the hub's)
    activation: str | None = None


def save_transcoder_set(transcoders: list[Any], path: str | Path, model_name: str = "") -> Path:
    """Write per-layer ReLU transcoders in circuit-tracer's layout: `config.yaml` and
    `layer_{L}.safetensors` per layer (encoder and decoder transposed)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    entries = []
    for tc in transcoders:
        c = tc.cfg
        if c.activation != "relu":
            raise ValueError(
                f"circuit-tracer's per-layer files hold ReLU transcoders; the one at layer "
                f"{c.layer} is {c.activation}: save it in SAELens's layout (tc.save(folder))"
            )
        tensors = {
            "W_enc": tc.W_enc.detach().T.contiguous(),
            "b_enc": tc.b_enc.detach().clone(),
            "W_dec": tc.W_dec.detach().T.contiguous(),
            "b_dec": tc.b_dec.detach().clone(),
        }
        if c.skip:
            tensors["W_skip"] = tc.W_skip.detach().clone()
        name = f"layer_{c.layer}.safetensors"
        safetensors.torch.save_file(tensors, str(path / name))
        entries.append({"id": f"layer_{c.layer}", "layer": c.layer, "filepath": name})
    first = transcoders[0].cfg
    config = {
        "model_name": model_name,
        "feature_input_hook": _relative(first.hook_name),
        "feature_output_hook": _relative(first.hook_name_out),
        "transcoders": entries,
    }
    (path / YAML_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return path


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
    if kind not in (None, "transcoder_set"):
        raise ValueError(
            f"{where}: model_kind {kind!r} is not a per-layer set ('transcoder_set'); a "
            f"'cross_layer_transcoder' loads with CrossLayerTranscoder.load"
        )
    activation = raw.get("activation")
    if activation == "topk":
        raise ValueError(
            f"{where}: activation 'topk' is circuit-tracer's TopK, which keeps negative values "
            f"among the top k; ours (SAELens's) passes them through a ReLU: not read"
        )
    if activation not in (None, "relu", "jumprelu"):
        raise ValueError(f"{where}: activation {activation!r} is not relu, jumprelu or topk")
    entries = raw.get("transcoders")
    if entries is None and kind is None:
        raise ValueError(f"{where} needs a non-empty list 'transcoders'")
    files = None if entries is None else _files(entries, where)
    square = "d_sae d_out" if kind else "d_out d_sae"
    return SetConfig(hooks[0], hooks[1], files, square, activation)


def _files(entries: Any, where: Path) -> dict[int, str]:
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{where}: 'transcoders' must be a non-empty list, got {entries!r}")
    files: dict[int, str] = {}
    for i, entry in enumerate(entries):
        layer, ref = (i, entry) if isinstance(entry, str) else (None, None)
        if isinstance(entry, dict):
            layer, ref = entry.get("layer"), entry.get("filepath")
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
    transposed = _decoder_transposed(file, found, d_sae, d_out, config.square_decoder)
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
    expected = {"W_enc": (d_sae, d_in), "b_enc": (d_sae,),
                "W_dec": (d_out, d_sae) if transposed else (d_sae, d_out), "b_dec": (d_out,),
                **({"W_skip": (d_out, d_in)} if skip else {}),
                **({_THRESHOLD: (d_sae,)} if jumprelu else {})}  # fmt: skip
    sizes = f"W_enc's d_sae={d_sae}, d_in={d_in} and b_dec's d_out={d_out}"
    _strict.check_tensors(file, found, expected, None, sizes)
    dtype = _strict.one_dtype(file, found)
    t = _strict.load_finite(file, list(expected))
    if jumprelu:
        t["threshold"] = _non_negative(file, t.pop(_THRESHOLD))
    t["W_enc"] = t["W_enc"].T
    t["W_dec"] = t["W_dec"].T if transposed else t["W_dec"]
    activation = "jumprelu" if jumprelu else "relu"
    return _build(cls, t, layer, config, activation, skip, dtype)


def _decoder_transposed(
    file: Path, found: dict[str, Any], d_sae: int, d_out: int, square: str
) -> bool:
    shape = found.get("W_dec", ((), None))[0]
    if shape == (d_sae, d_out) and (d_sae != d_out or square == "d_sae d_out"):
        return False
    if shape == (d_out, d_sae):
        return True
    raise ValueError(
        f"{file}: W_dec has shape {shape}, expected ({d_sae}, {d_out}) [d_sae d_out] or "
        f"({d_out}, {d_sae}) [d_out d_sae] for W_enc's d_sae={d_sae} and b_dec's d_out={d_out}"
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


def _relative(hook_name: str) -> str:
    """`blocks.3.ln2.hook_out` -> `ln2.hook_out` (circuit-tracer names hooks within a block)."""
    match = re.fullmatch(r"blocks\.\d+\.(.+)", hook_name)
    if match is None:
        raise ValueError(f"expected a hook name inside a block (blocks.L....), got {hook_name!r}")
    return match.group(1)
