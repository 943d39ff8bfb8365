"""Strict reading of coder files (transcoders' `cfg.json` and safetensors), shared helpers.

What a file says is checked before anything is allocated from it: sizes must be positive
integers written as JSON integers (not `64.0`, `"64"` or `true`), dtypes one of ours, every
tensor's shape and dtype (read from the safetensors header, without loading the data) the
one the config implies; the tensors, once read, must be finite. Each failure is a
`ValueError` naming the file, the field or tensor, what it holds and what was expected.
"""

import json
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch

from hookedattn.sae.config import DTYPES

_SAFETENSORS_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
}


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in `path`; a `ValueError` if it is missing, not JSON or not an object."""
    if not path.is_file():
        raise ValueError(f"{path} does not exist")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(raw, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(raw).__name__}")
    return raw


def positive_int(raw: dict[str, Any], field: str, where: Path) -> int:
    """`raw[field]`, which must be a JSON integer >= 1."""
    if field not in raw:
        raise ValueError(f"{where} lacks {field!r} (a positive integer)")
    value = raw[field]
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{where}: {field} must be a positive integer, got {value!r}")
    return value


def dtype_name(raw: dict[str, Any], where: Path, default: str = "float32") -> str:
    """The config's dtype (`"float32"`, `"torch.float32"`...) as one of `DTYPES`' names."""
    value = raw.get("dtype", default)
    name = str(value).removeprefix("torch.") if isinstance(value, str) else value
    if name not in DTYPES:
        raise ValueError(f"{where}: dtype {value!r} is not one of {tuple(DTYPES)}")
    return name


def tensor_shapes(path: Path) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Each tensor's `(shape, dtype)` in the safetensors file `path`, from its header only."""
    if not path.is_file():
        raise ValueError(f"{path} does not exist")
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            out = {}
            for key in f.keys():  # noqa: SIM118 (a safe_open handle is not a mapping)
                piece = f.get_slice(key)
                kind = piece.get_dtype()
                if kind not in _SAFETENSORS_DTYPES:
                    raise ValueError(
                        f"{path}: tensor {key} is {kind}; coder weights are floating point "
                        f"({', '.join(_SAFETENSORS_DTYPES)})"
                    )
                out[key] = (tuple(piece.get_shape()), _SAFETENSORS_DTYPES[kind])
            return out
    except safetensors.SafetensorError as e:
        raise ValueError(f"{path} is not a readable safetensors file: {e}") from None


def check_tensors(
    path: Path,
    found: dict[str, tuple[tuple[int, ...], torch.dtype]],
    expected: dict[str, tuple[int, ...]],
    dtype: torch.dtype | None,
    sizes: str,
) -> None:
    """Every `expected` tensor is in the file with that shape (and `dtype`, unless None);
    `sizes` says which config values the shapes come from, for the message."""
    missing = sorted(set(expected) - set(found))
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}; it holds {sorted(found)}")
    extra = sorted(set(found) - set(expected))
    if extra:  # a W_skip in a file whose config has none would be dropped, silently
        raise ValueError(
            f"{path} holds tensors its config does not have: {extra} (expected "
            f"{sorted(expected)} for {sizes}): the file and its config disagree"
        )
    for name, shape in expected.items():
        got_shape, got_dtype = found[name]
        if got_shape != shape:
            raise ValueError(f"{path}: {name} has shape {got_shape}, expected {shape} for {sizes}")
        if dtype is not None and got_dtype != dtype:
            raise ValueError(
                f"{path}: {name} is {got_dtype}, but the config says {dtype}: the file and its "
                f"config disagree (convert one of them)"
            )


def one_dtype(path: Path, found: dict[str, tuple[tuple[int, ...], torch.dtype]]) -> str:
    """The one dtype all of a file's tensors share, as a `DTYPES` name."""
    kinds = {dtype for _, dtype in found.values()}
    names = {str(k).removeprefix("torch.") for k in kinds}
    if len(names) != 1 or not names <= set(DTYPES):
        raise ValueError(
            f"{path}: the tensors must share one dtype of {tuple(DTYPES)}, got {sorted(names)}"
        )
    return names.pop()


def load_finite(path: Path, names: list[str] | None = None) -> dict[str, torch.Tensor]:
    """The tensors `names` (all when None) of a safetensors file, refusing NaN or infinity."""
    tensors = safetensors.torch.load_file(str(path))
    if names is not None:
        tensors = {name: tensors[name] for name in names}
    for name, t in tensors.items():
        if not bool(torch.isfinite(t).all()):
            bad = int((~torch.isfinite(t)).sum())
            raise ValueError(f"{path}: {name} holds {bad} NaN or infinite values")
    return tensors


def hook_name(raw: dict[str, Any], field: str, where: Path) -> str:
    """A hook name field, top level or under `metadata` (SAELens 6 keeps it there)."""
    metadata = raw.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise ValueError(f"{where}: metadata must be an object, got {metadata!r}")
    value = raw.get(field) or metadata.get(field) or ""
    if not isinstance(value, str):
        raise ValueError(f"{where}: {field} must be a string, got {value!r}")
    return value
