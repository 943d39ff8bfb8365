"""Saving and loading SAEs in SAELens's on-disk layout.

A folder holds `cfg.json` and `sae_weights.safetensors` with tensors `W_enc [d_in d_sae]`,
`W_dec [d_sae d_in]`, `b_enc [d_sae]`, `b_dec [d_in]` and, for JumpReLU, `threshold
[d_sae]`. `cfg.json` carries SAELens's fields: `architecture` ("standard", "topk",
"jumprelu"), `d_in`, `d_sae`, `dtype`, `apply_b_dec_to_input` (our tied pre-bias),
`normalize_activations`, `reshape_activations`, and `hook_name` (top level before SAELens
6, under `metadata` since) and TopK's `k` (`activation_fn_kwargs` before 6, top level
since). We write both spellings, so either version reads our folders; how a `cfg.json`
is read is in `hookedattn.sae._saelens_cfg`.

An untied pre-bias has no SAELens field; it is folded into the encoder bias on save
(`(x - b_pre) W_enc + b_enc = x W_enc + (b_enc - b_pre W_enc)`), so the folder means the
same SAE to SAELens, and `b_pre` is kept beside it, in `hookedattn_weights.safetensors`
(SAELens loads `sae_weights.safetensors` strictly, so it must hold SAELens's tensors
only), for our loader to unfold.

Loading trusts nothing: the weights file's header (names, shapes, dtypes) is checked
against the config before a tensor is read or the SAE is built, weights must be floating
point and finite (a NaN weight or threshold is named, not spliced into a model).
"""

import json
from pathlib import Path
from typing import Any

import safetensors.torch
import torch

from hookedattn.core import MAX_CONFIG_BYTES, read_safetensors_header
from hookedattn.sae._saelens_cfg import ARCHITECTURES, parse_config

CFG_FILE = "cfg.json"
WEIGHTS_FILE = "sae_weights.safetensors"
EXTRA_FILE = "hookedattn_weights.safetensors"
_OURS = ("W_enc", "W_dec", "b_enc", "b_dec")


def save(sae: Any, path: str | Path) -> Path:
    """Write `sae` into the folder `path` (created if missing); returns the folder."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    c = sae.cfg
    tensors = {n: getattr(sae, n).detach().contiguous() for n in ("W_enc", "W_dec", "b_dec")}
    tensors["b_enc"] = sae.b_enc.detach().clone()
    if c.pre_bias == "untied":
        b_pre = sae.pre_bias.b_pre.detach()
        tensors["b_enc"] = tensors["b_enc"] - b_pre @ sae.W_enc.detach()
        safetensors.torch.save_file({"b_pre": b_pre.contiguous()}, str(path / EXTRA_FILE))
    else:
        (path / EXTRA_FILE).unlink(missing_ok=True)  # a previous save's, no longer true
    if c.activation == "jumprelu":
        tensors["threshold"] = sae.activation.threshold.detach().clone()
    kwargs = {"k": c.k} if c.k is not None else {}
    cfg = {
        "architecture": ARCHITECTURES[c.activation],
        "d_in": c.d_in,
        "d_sae": c.d_sae,
        "dtype": c.dtype,
        "device": "cpu",
        "apply_b_dec_to_input": c.pre_bias == "tied",
        "normalize_activations": "none",
        "reshape_activations": c.reshape_activations,
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
    return load_with_config(cls, path, read_config(path))


def read_config(path: str | Path) -> dict[str, Any]:
    """The `cfg.json` of the SAE folder `path`, as written (checked to be a JSON object of a
    sane size, in a folder that has the weights too)."""
    path = Path(path)
    missing = [f for f in (CFG_FILE, WEIGHTS_FILE) if not (path / f).is_file()]
    if missing:
        found = sorted(p.name for p in path.iterdir()) if path.is_dir() else "no such folder"
        raise ValueError(
            f"{path} is not an SAE folder: it lacks {', '.join(missing)} (an SAE folder holds "
            f"{CFG_FILE} and {WEIGHTS_FILE}); found: {found}"
        )
    if (path / CFG_FILE).stat().st_size > MAX_CONFIG_BYTES:
        raise ValueError(f"{path / CFG_FILE} is not an SAE config: it is larger than 16 MiB")
    try:
        return json.loads((path / CFG_FILE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise ValueError(f"{path / CFG_FILE} is not valid JSON: {e}") from None


def load_with_config(cls: type, path: str | Path, raw: Any) -> Any:
    """The SAE in folder `path` as the config `raw` (a `cfg.json`'s contents, perhaps
    amended, as a release's overrides amend it) describes it."""
    path = Path(path)
    parsed = parse_config(raw, path / CFG_FILE)
    expected = _expected_shapes(parsed.cfg)
    tensors = _read_tensors(path, expected)
    if parsed.fold_decoder_norms:
        _fold_decoder_norms(tensors, path)
    sae = cls(parsed.cfg)
    _fill(sae, tensors)
    return sae


def _expected_shapes(c: Any) -> dict[str, tuple[int, ...]]:
    shapes = {
        "W_enc": (c.d_in, c.d_sae),
        "W_dec": (c.d_sae, c.d_in),
        "b_enc": (c.d_sae,),
        "b_dec": (c.d_in,),
    }
    if c.activation == "jumprelu":
        shapes["threshold"] = (c.d_sae,)
    if c.pre_bias == "untied":
        shapes["b_pre"] = (c.d_in,)
    return shapes


def _read_tensors(path: Path, expected: dict[str, tuple[int, ...]]) -> dict[str, torch.Tensor]:
    """The tensors of the folder, each checked in the header (name, shape, floating dtype)
    before any is read, then checked to be finite."""
    files = [path / WEIGHTS_FILE]
    if "b_pre" in expected and (path / EXTRA_FILE).is_file():
        files.append(path / EXTRA_FILE)  # older folders keep b_pre in the weights file
    headers = {n: (f, h) for f in files for n, h in read_safetensors_header(f).items()}
    # Older SAELens JumpReLU checkpoints store log(threshold), as SAELens still reads.
    stored = {n: n for n in expected}
    if "threshold" in expected and "threshold" not in headers and "log_threshold" in headers:
        stored["threshold"] = "log_threshold"
    missing = sorted(n for n, s in stored.items() if s not in headers)
    if missing:
        raise ValueError(
            f"{path / WEIGHTS_FILE} lacks {', '.join(missing)}; it holds {sorted(headers)}"
        )
    # SAELens drops a `scaling_factor` of ones (an unused finetuning scale); so do we.
    extra = sorted(set(headers) - set(stored.values()) - {"scaling_factor"})
    if extra:
        raise ValueError(
            f"{path / WEIGHTS_FILE} holds tensors this SAE does not have: {extra} (expected "
            f"{sorted(expected)}); SAELens refuses them too"
        )
    for name, shape in expected.items():
        file, header = headers[stored[name]]
        if tuple(header.shape) != shape:
            raise ValueError(
                f"{file}: {stored[name]} has shape {tuple(header.shape)}, expected {shape} "
                f"for d_in={expected['b_dec'][0]}, d_sae={expected['b_enc'][0]}"
            )
        if not header.dtype.is_floating_point:
            raise ValueError(
                f"{file}: {stored[name]} is {header.dtype}, not floating point: an SAE's "
                f"weights are float32, float64, bfloat16 or float16 (other kinds are not cast)"
            )
    tensors = {name: _tensor(headers[s][0], s) for name, s in stored.items()}
    if stored.get("threshold") == "log_threshold":
        tensors["threshold"] = tensors["threshold"].exp()
    if "scaling_factor" in headers:
        factor = _tensor(headers["scaling_factor"][0], "scaling_factor")
        if not bool((factor == 1).all()):
            raise ValueError(
                f"{path / WEIGHTS_FILE} holds a scaling_factor other than ones (a finetuning "
                f"scale), which is not supported"
            )
    for name, tensor in tensors.items():
        bad = int((~tensor.isfinite()).sum())
        if bad:
            raise ValueError(
                f"{headers[stored[name]][0]}: {name} holds {bad} non-finite value(s) (NaN or "
                f"inf); an SAE with them makes every activation it is spliced at non-finite "
                f"(or, in a threshold, silences its features)"
            )
    return tensors


def _tensor(file: Path, name: str) -> torch.Tensor:
    with safetensors.safe_open(str(file), framework="pt") as f:
        return f.get_tensor(name)


def _fold_decoder_norms(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """`rescale_acts_by_decoder_norm`: SAELens computes `topk(pre · |W_dec[f]|)` and decodes
    `acts / |W_dec[f]|`; scaling encoder column `f` and `b_enc[f]` by the norm and the
    decoder row by its inverse gives the same features and reconstruction without it
    (SAELens's `fold_W_dec_norm`)."""
    norms = tensors["W_dec"].double().norm(dim=-1)
    if not bool((norms > 0).all()):
        dead = (norms == 0).nonzero().flatten()[:5].tolist()
        raise ValueError(
            f"{path / WEIGHTS_FILE}: rescale_acts_by_decoder_norm divides by each decoder "
            f"row's norm, and features {dead} have a zero decoder row"
        )
    dtype = tensors["W_dec"].dtype
    tensors["W_enc"] = (tensors["W_enc"].double() * norms).to(dtype)
    tensors["b_enc"] = (tensors["b_enc"].double() * norms).to(dtype)
    tensors["W_dec"] = (tensors["W_dec"].double() / norms[:, None]).to(dtype)


def _fill(sae: Any, tensors: dict[str, torch.Tensor]) -> None:
    """Copy the checked tensors into `sae` (its float width converted to the config's)."""
    c = sae.cfg
    targets = {n: getattr(sae, n) for n in _OURS}
    if c.activation == "jumprelu":
        targets["threshold"] = sae.activation.threshold
    if c.pre_bias == "untied":
        targets["b_pre"] = sae.pre_bias.b_pre
    with torch.no_grad():
        for name, param in targets.items():
            param.copy_(tensors[name].to(param.dtype))
        if c.pre_bias == "untied":  # undo the fold made on save (module docstring)
            sae.b_enc.add_(sae.pre_bias.b_pre @ sae.W_enc)
