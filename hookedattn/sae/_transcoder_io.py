"""Transcoder files: SAELens's per-layer layout, and circuit-tracer's where it differs.

SAELens (a folder; `sae_lens.saes.transcoder`): `cfg.json` with `architecture`
(`"transcoder"`, `"skip_transcoder"`, `"jumprelu_transcoder"`), `d_in`, `d_sae`, `d_out`,
`dtype`, `apply_b_dec_to_input: false`, `normalize_activations: "none"` and, under
`metadata`, `hook_name` and `hook_name_out`; `sae_weights.safetensors` with `W_enc [d_in
d_sae]`, `b_enc [d_sae]`, `W_dec [d_sae d_out]`, `b_dec [d_out]`, `W_skip [d_out d_in]` (skip)
and `threshold [d_sae]` (JumpReLU). SAELens has no TopK transcoder and no JumpReLU skip
transcoder: those are written as `"topk_transcoder"` (with `k`), `"topk_skip_transcoder"`,
`"jumprelu_skip_transcoder"`, names SAELens refuses rather than misreads.

circuit-tracer's per-layer sets are read and written by `hookedattn.sae._circuit_tracer_io`.

circuit-tracer 0.5, cross-layer (`load_clt`, `CrossLayerTranscoder.to_safetensors`): a
folder of `W_enc_{l}.safetensors` (`W_enc_{l} [d_sae d_in]`, `b_enc_{l}`, `b_dec_{l}`, and
`threshold_{l}` for JumpReLU, refused when negative as for a per-layer set) and
`W_dec_{l}.safetensors` (`W_dec_{l} [d_sae layer_out d_out]`), one pair per layer, and a
`config.yaml` (`model_kind: cross_layer_transcoder`, which circuit-tracer's
`load_transcoders_from_cache` needs, `model_name`, `feature_input_hook`,
`feature_output_hook` in circuit-tracer's names: `_circuit_tracer_names`). A TopK
cross-layer transcoder has no circuit-tracer form; its `config.yaml` says `activation: topk`
and `k` under `hookedattn` (circuit-tracer itself would take it for ReLU). Our
`config.yaml` is written as JSON, which is also YAML; circuit-tracer's (YAML) is read
with PyYAML when it is installed.

Everything a file says is checked before anything is allocated from it
(`hookedattn.sae._strict`): integer sizes, a known dtype, each tensor's shape and dtype
from the safetensors header; the tensors, once read, must be finite.
"""

import json
import re
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from hookedattn.sae import _circuit_tracer_names as _ct_names
from hookedattn.sae import _strict
from hookedattn.sae.transcoder_config import CrossLayerTranscoderConfig, TranscoderConfig

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
YAML_FILE = "config.yaml"
_ARCHITECTURES = {
    ("relu", False): "transcoder",
    ("relu", True): "skip_transcoder",
    ("jumprelu", False): "jumprelu_transcoder",
    ("jumprelu", True): "jumprelu_skip_transcoder",
    ("topk", False): "topk_transcoder",
    ("topk", True): "topk_skip_transcoder",
}
_VARIANTS = {name: variant for variant, name in _ARCHITECTURES.items()}


# ---------------------------------------------------------------------- SAELens, one layer
def save_transcoder(tc: Any, path: str | Path) -> Path:
    """Write `tc` (a `Transcoder`) into folder `path` in SAELens's layout; returns the folder."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    c = tc.cfg
    owner = {"threshold": tc.activation}
    tensors = {
        n: getattr(owner.get(n, tc), n).detach().contiguous().clone() for n in _tensor_names(c)
    }
    k = {"k": c.k} if c.k is not None else {}
    hooks = {"hook_name": c.hook_name, "hook_name_out": c.hook_name_out}
    cfg = {
        "architecture": _ARCHITECTURES[(c.activation, c.skip)],
        "d_in": c.d_in,
        "d_sae": c.d_sae,
        "d_out": c.d_out,
        "dtype": c.dtype,
        "device": "cpu",
        "apply_b_dec_to_input": False,
        "normalize_activations": "none",
        "reshape_activations": "none",
        **k,
        "activation_fn_kwargs": k,
        **hooks,
        "metadata": {**hooks, "hook_head_index": None, "hook_head_index_out": None},
        "hookedattn": {"seed": c.seed},
    }
    safetensors.torch.save_file(tensors, str(path / WEIGHTS_FILE))
    (path / CFG_FILE).write_text(json.dumps(cfg, indent=2) + "\n")
    return path


def load_transcoder(cls: type, path: str | Path) -> Any:
    """The transcoder (a `cls`) in SAELens's folder layout at `path`, checked throughout."""
    path = Path(path)
    missing = [f for f in (CFG_FILE, WEIGHTS_FILE) if not (path / f).is_file()]
    if missing:
        found = sorted(p.name for p in path.iterdir()) if path.is_dir() else "no such folder"
        raise ValueError(
            f"{path} is not a transcoder folder: it lacks {', '.join(missing)} (SAELens's "
            f"layout holds {CFG_FILE} and {WEIGHTS_FILE}); found: {found}"
        )
    cfg = _transcoder_config(_strict.read_json(path / CFG_FILE), path / CFG_FILE)
    weights = path / WEIGHTS_FILE
    expected = _expected_shapes(cfg)
    sizes = f"d_in={cfg.d_in}, d_sae={cfg.d_sae}, d_out={cfg.d_out}"
    _strict.check_tensors(weights, _strict.tensor_shapes(weights), expected, cfg.torch_dtype, sizes)
    tc = cls(cfg)
    fill(tc, _strict.load_finite(weights, list(expected)))
    return tc


def _tensor_names(c: TranscoderConfig) -> list[str]:
    names = ["W_enc", "b_enc", "W_dec", "b_dec"]
    names += ["W_skip"] if c.skip else []
    return names + (["threshold"] if c.activation == "jumprelu" else [])


def _expected_shapes(c: TranscoderConfig) -> dict[str, tuple[int, ...]]:
    shapes = {
        "W_enc": (c.d_in, c.d_sae),
        "b_enc": (c.d_sae,),
        "W_dec": (c.d_sae, c.d_out),
        "b_dec": (c.d_out,),
        "W_skip": (c.d_out, c.d_in),
        "threshold": (c.d_sae,),
    }
    return {name: shapes[name] for name in _tensor_names(c)}


def _transcoder_config(raw: dict[str, Any], where: Path) -> TranscoderConfig:
    """Our `TranscoderConfig` from a SAELens `cfg.json`, refusing what we do not implement."""
    architecture = raw.get("architecture")
    if architecture not in _VARIANTS:
        raise ValueError(
            f"{where}: architecture {architecture!r} is not a transcoder we read; we read "
            f"{', '.join(_VARIANTS)} (an SAE's folder loads with SparseAutoencoder.load)"
        )
    if raw.get("apply_b_dec_to_input"):
        raise ValueError(
            f"{where}: apply_b_dec_to_input is true, which a transcoder cannot do (its b_dec "
            f"is the output's); SAELens refuses it too"
        )
    for field in ("normalize_activations", "reshape_activations"):
        if raw.get(field, "none") not in (None, "none"):
            raise ValueError(
                f"{where}: {field}={raw[field]!r} changes the inputs at run time, which is not "
                f"supported; fold it into the weights first"
            )
    activation, skip = _VARIANTS[architecture]
    sizes = {f: _strict.positive_int(raw, f, where) for f in ("d_in", "d_sae", "d_out")}
    k = None
    if activation == "topk":
        kwargs = raw.get("activation_fn_kwargs") or {}
        k = _strict.positive_int(raw if "k" in raw else kwargs, "k", where)
    ours = raw.get("hookedattn") or {}
    try:
        return TranscoderConfig(
            **sizes,
            hook_name=_strict.hook_name(raw, "hook_name", where),
            hook_name_out=_strict.hook_name(raw, "hook_name_out", where),
            activation=activation,
            k=k,
            skip=skip,
            dtype=_strict.dtype_name(raw, where),
            seed=ours.get("seed") if isinstance(ours, dict) else None,
        )
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def fill(module: Any, tensors: dict[str, torch.Tensor]) -> None:
    """Copy checked tensors into a transcoder's parameters, by SAELens's names."""
    targets = {"W_enc": module.W_enc, "b_enc": module.b_enc, "W_dec": module.W_dec,
               "b_dec": module.b_dec}  # fmt: skip
    if "W_skip" in tensors:
        targets["W_skip"] = module.W_skip
    if "threshold" in tensors:
        targets["threshold"] = module.activation.threshold
    with torch.no_grad():
        for name, param in targets.items():
            param.copy_(tensors[name])


# ---------------------------------------------------------------- circuit-tracer, cross-layer
def save_cross_layer(clt: Any, path: str | Path, model_name: str = "") -> Path:
    """Write a `CrossLayerTranscoder` in circuit-tracer 0.5's layout (module docstring)."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    c = clt.cfg
    for layer in range(c.n_layers):
        enc = {f"W_enc_{layer}": clt.W_enc[layer].detach().T.contiguous(),
               f"b_enc_{layer}": clt.b_enc[layer].detach().clone(),
               f"b_dec_{layer}": clt.b_dec[layer].detach().clone()}  # fmt: skip
        if c.activation == "jumprelu":
            # ours with a threshold t < 0 is circuit-tracer's with 0 (_circuit_tracer_io)
            threshold = clt.activations[layer].threshold.detach().clamp(min=0)
            enc[f"threshold_{layer}"] = threshold
        safetensors.torch.save_file(enc, str(path / f"W_enc_{layer}.safetensors"))
        dec = {f"W_dec_{layer}": clt.W_dec[layer].detach().contiguous().clone()}
        safetensors.torch.save_file(dec, str(path / f"W_dec_{layer}.safetensors"))
    config = {
        "model_kind": _ct_names.CROSS_LAYER,
        "model_name": model_name,
        "feature_input_hook": _ct_names.theirs(c.feature_input_hook),
        "feature_output_hook": _ct_names.theirs(c.feature_output_hook),
        "hookedattn": {"activation": c.activation, "k": c.k, "seed": c.seed},
    }
    (path / YAML_FILE).write_text(json.dumps(config, indent=2) + "\n")
    return path


def load_cross_layer(cls: type, path: str | Path) -> Any:
    """The `CrossLayerTranscoder` (a `cls`) in circuit-tracer's folder layout at `path`."""
    path = Path(path)
    layers = sorted(int(m.group(1)) for p in path.glob("W_enc_*.safetensors")
                    if (m := re.fullmatch(r"W_enc_(\d+)\.safetensors", p.name)))  # fmt: skip
    if not layers or layers != list(range(len(layers))):
        found = sorted(p.name for p in path.iterdir()) if path.is_dir() else "no such folder"
        raise ValueError(
            f"{path} is not a cross-layer transcoder folder: it needs W_enc_0.safetensors ... "
            f"W_enc_{{n-1}}.safetensors and W_dec_*.safetensors; found: {found}"
        )
    config = read_yaml(path / YAML_FILE) if (path / YAML_FILE).is_file() else {}
    kind = config.get("model_kind", _ct_names.CROSS_LAYER)
    if kind != _ct_names.CROSS_LAYER:
        raise ValueError(
            f"{path / YAML_FILE}: model_kind {kind!r} is not a cross-layer transcoder "
            f"({_ct_names.CROSS_LAYER!r}); a per-layer set loads with load_transcoder_set"
        )
    cfg = _cross_layer_config(path, len(layers), config)
    tensors = {}
    for layer in range(cfg.n_layers):
        tensors.update(_check_cross_layer_files(path, layer, cfg))
    clt = cls(cfg)
    with torch.no_grad():
        for layer in range(cfg.n_layers):
            clt.W_enc[layer].copy_(tensors[f"W_enc_{layer}"].T)
            clt.b_enc[layer].copy_(tensors[f"b_enc_{layer}"])
            clt.b_dec[layer].copy_(tensors[f"b_dec_{layer}"])
            clt.W_dec[layer].copy_(tensors[f"W_dec_{layer}"])
            if cfg.activation == "jumprelu":
                clt.activations[layer].threshold.copy_(tensors[f"threshold_{layer}"])
    return clt


def _cross_layer_config(path: Path, n_layers: int, config: dict) -> CrossLayerTranscoderConfig:
    first = path / "W_enc_0.safetensors"
    found = _strict.tensor_shapes(first)
    if "W_enc_0" not in found or len(found["W_enc_0"][0]) != 2 or "b_dec_0" not in found:
        raise ValueError(
            f"{first} needs W_enc_0 [d_sae d_in] and b_dec_0; it holds {sorted(found)}"
        )
    (d_sae, d_in), (d_out,) = found["W_enc_0"][0], found["b_dec_0"][0]
    ours = config.get("hookedattn") or {}
    activation = ours.get("activation") or ("jumprelu" if "threshold_0" in found else "relu")
    k = ours.get("k") if activation == "topk" else None
    try:
        return CrossLayerTranscoderConfig(
            n_layers, d_in, d_sae, d_out, activation, k,
            feature_input_hook=_ct_names.ours(config.get("feature_input_hook", "hook_resid_mid")),
            feature_output_hook=_ct_names.ours(config.get("feature_output_hook", "hook_mlp_out")),
            dtype=_strict.one_dtype(first, found), seed=ours.get("seed"),
        )  # fmt: skip
    except ValueError as e:
        raise ValueError(f"{path}: {e}") from None


def _check_cross_layer_files(
    path: Path, layer: int, c: CrossLayerTranscoderConfig
) -> dict[str, torch.Tensor]:
    enc, dec = path / f"W_enc_{layer}.safetensors", path / f"W_dec_{layer}.safetensors"
    expected_enc = {f"W_enc_{layer}": (c.d_sae, c.d_in), f"b_enc_{layer}": (c.d_sae,),
                    f"b_dec_{layer}": (c.d_out,)}  # fmt: skip
    if c.activation == "jumprelu":
        expected_enc[f"threshold_{layer}"] = (c.d_sae,)
    expected_dec = {f"W_dec_{layer}": (c.d_sae, c.n_layers - layer, c.d_out)}
    sizes = f"n_layers={c.n_layers}, d_in={c.d_in}, d_sae={c.d_sae}, d_out={c.d_out}"
    _strict.check_tensors(enc, _strict.tensor_shapes(enc), expected_enc, c.torch_dtype, sizes)
    _strict.check_tensors(dec, _strict.tensor_shapes(dec), expected_dec, c.torch_dtype, sizes)
    tensors = {**_strict.load_finite(enc, list(expected_enc)),
               **_strict.load_finite(dec, list(expected_dec))}  # fmt: skip
    negative = int((tensors.get(f"threshold_{layer}", torch.zeros(())) < 0).sum())
    if negative:
        raise ValueError(
            f"{enc}: threshold_{layer} holds {negative} negative value(s); circuit-tracer's "
            f"JumpReLU passes pre-activations between such a threshold and 0, ours (SAELens's) "
            f"does not: not read"
        )
    return tensors


# ---------------------------------------------------------------------- shared
def read_yaml(path: Path) -> dict[str, Any]:
    """A `config.yaml`: ours is JSON (a subset of YAML); a hand-written one needs PyYAML."""
    if not path.is_file():
        raise ValueError(f"{path} does not exist")
    text = path.read_text()
    try:
        raw = json.loads(text)
    except json.JSONDecodeError:
        try:
            import yaml  # optional: only hand-written circuit-tracer configs need it
        except ImportError:
            raise ValueError(
                f"{path} is YAML that is not JSON; reading it needs PyYAML (pip install pyyaml)"
            ) from None
        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as e:
            raise ValueError(f"{path} is not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} must hold a mapping, got {type(raw).__name__}")
    return raw
