"""Saving and loading SAEs in SAELens's on-disk layout.

A folder holds `cfg.json` and `sae_weights.safetensors` with tensors `W_enc [d_in d_sae]`,
`W_dec [d_sae d_in]`, `b_enc [d_sae]`, `b_dec [d_in]` and, for JumpReLU, `threshold
[d_sae]`. `cfg.json` carries SAELens's fields: `architecture` ("standard", "topk",
"jumprelu"), `d_in`, `d_sae`, `dtype`, `apply_b_dec_to_input` (our tied pre-bias),
`normalize_activations`, and `hook_name` (top level before SAELens 6, under `metadata`
since) and TopK's `k` (`activation_fn_kwargs` before 6, top level since). We write both
spellings, so either version reads our folders.

An untied pre-bias has no SAELens field; it is folded into the encoder bias on save
(`(x - b_pre) W_enc + b_enc = x W_enc + (b_enc - b_pre W_enc)`), so the folder means the
same SAE to SAELens, and `b_pre` is kept beside it for our loader to unfold.
"""

import json
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from hookedattn.sae.config import DTYPES, SAEConfig

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
_ARCHITECTURES = {"relu": "standard", "topk": "topk", "jumprelu": "jumprelu"}
_ACTIVATIONS = {v: k for k, v in _ARCHITECTURES.items()}
_NO_NORMALIZATION = (None, "none")


def save(sae: Any, path: str | Path) -> Path:
    """Write `sae` into the folder `path` (created if missing); returns the folder."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    c = sae.cfg
    tensors = {n: getattr(sae, n).detach().contiguous() for n in ("W_enc", "W_dec", "b_dec")}
    tensors["b_enc"] = sae.b_enc.detach().clone()
    if c.pre_bias == "untied":
        b_pre = sae.pre_bias.b_pre.detach()
        tensors["b_pre"] = b_pre.clone()
        tensors["b_enc"] = tensors["b_enc"] - b_pre @ sae.W_enc.detach()
    if c.activation == "jumprelu":
        tensors["threshold"] = sae.activation.threshold.detach().clone()
    kwargs = {"k": c.k} if c.k is not None else {}
    cfg = {
        "architecture": _ARCHITECTURES[c.activation],
        "d_in": c.d_in,
        "d_sae": c.d_sae,
        "dtype": c.dtype,
        "device": "cpu",
        "apply_b_dec_to_input": c.pre_bias == "tied",
        "normalize_activations": "none",
        "activation_fn_str": "topk" if c.activation == "topk" else "relu",
        "activation_fn_kwargs": kwargs,
        **kwargs,
        "hook_name": c.hook_name,
        "metadata": {"hook_name": c.hook_name},
        "hookedattn": {"pre_bias": c.pre_bias, "seed": c.seed},
    }
    safetensors.torch.save_file(tensors, str(path / WEIGHTS_FILE))
    (path / CFG_FILE).write_text(json.dumps(cfg, indent=2) + "\n")
    return path


def load(cls: type, path: str | Path) -> Any:
    """The SAE (a `cls`, `SparseAutoencoder`) in folder `path` (ours or SAELens's); a
    `ValueError` says what is wrong. The class is given, not imported: the autoencoder
    module imports this one."""
    path = Path(path)
    missing = [f for f in (CFG_FILE, WEIGHTS_FILE) if not (path / f).is_file()]
    if missing:
        found = sorted(p.name for p in path.iterdir()) if path.is_dir() else "no such folder"
        raise ValueError(
            f"{path} is not an SAE folder: it lacks {', '.join(missing)} (an SAE folder holds "
            f"{CFG_FILE} and {WEIGHTS_FILE}); found: {found}"
        )
    try:
        raw = json.loads((path / CFG_FILE).read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path / CFG_FILE} is not valid JSON: {e}") from None
    cfg = _config(raw, path)
    tensors = safetensors.torch.load_file(str(path / WEIGHTS_FILE))
    sae = cls(cfg)
    _fill(sae, tensors, path)
    return sae


def _config(raw: dict, path: Path) -> SAEConfig:
    """Our `SAEConfig` from a `cfg.json`, refusing what we do not implement."""
    if not isinstance(raw, dict) or "d_in" not in raw or "d_sae" not in raw:
        raise ValueError(f"{path / CFG_FILE} is not an SAE config: it needs d_in and d_sae")
    architecture = raw.get("architecture", "standard")
    if architecture not in _ACTIVATIONS:
        raise ValueError(
            f"{path}: architecture {architecture!r} is not supported; supported: "
            f"{', '.join(_ACTIVATIONS)}"
        )
    if raw.get("normalize_activations") not in _NO_NORMALIZATION:
        raise ValueError(
            f"{path}: normalize_activations={raw['normalize_activations']!r} rescales inputs "
            f"at run time, which is not supported; fold the scale into the weights first"
        )
    if raw.get("finetuning_scaling_factor"):
        raise ValueError(f"{path}: finetuning_scaling_factor is not supported")
    dtype = str(raw.get("dtype", "float32")).removeprefix("torch.")
    if dtype not in DTYPES:
        raise ValueError(f"{path}: dtype {dtype!r} is not one of {tuple(DTYPES)}")
    ours = raw.get("hookedattn", {})
    hook_name = raw.get("hook_name") or raw.get("metadata", {}).get("hook_name") or ""
    k = raw.get("k", raw.get("activation_fn_kwargs", {}).get("k"))
    tied = raw.get("apply_b_dec_to_input", True)
    return SAEConfig(
        d_in=int(raw["d_in"]),
        d_sae=int(raw["d_sae"]),
        hook_name=hook_name,
        activation=_ACTIVATIONS[architecture],
        k=int(k) if architecture == "topk" and k is not None else None,
        pre_bias=ours.get("pre_bias", "tied" if tied else "none"),
        dtype=dtype,
        seed=ours.get("seed"),
    )


def _fill(sae: Any, tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Copy the file's tensors into `sae`, checking names and shapes."""
    c = sae.cfg
    targets = {n: getattr(sae, n) for n in ("W_enc", "W_dec", "b_enc", "b_dec")}
    if c.activation == "jumprelu":
        targets["threshold"] = sae.activation.threshold
    if c.pre_bias == "untied":
        targets["b_pre"] = sae.pre_bias.b_pre
    missing = sorted(set(targets) - set(tensors))
    if missing:
        raise ValueError(
            f"{path / WEIGHTS_FILE} lacks {', '.join(missing)}; it holds {sorted(tensors)}"
        )
    with torch.no_grad():
        for name, param in targets.items():
            t = tensors[name]
            if tuple(t.shape) != tuple(param.shape):
                raise ValueError(
                    f"{path / WEIGHTS_FILE}: {name} has shape {tuple(t.shape)}, expected "
                    f"{tuple(param.shape)} for d_in={c.d_in}, d_sae={c.d_sae}"
                )
            param.copy_(t.to(param.dtype))
        if c.pre_bias == "untied":  # undo the fold made on save (module docstring)
            sae.b_enc.add_(sae.pre_bias.b_pre @ sae.W_enc)
