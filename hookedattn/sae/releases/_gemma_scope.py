"""Gemma Scope's SAE files: `params.npz` (Gemma Scope, Lieberum et al. 2024; SAELens's
`gemma_2` loader) and `params.safetensors` (Gemma Scope 2; SAELens's `gemma_3`).

Each folder holds one JumpReLU SAE without a pre-bias:

    pre    = x @ W_enc + b_enc
    acts   = relu(pre) * (pre > threshold)
    recons = acts @ W_dec + b_dec

stored as `W_enc [d_in d_sae]`, `W_dec [d_sae d_in]`, `b_enc [d_sae]`, `b_dec [d_in]`,
`threshold [d_sae]` (Gemma Scope 2 spells them `w_enc`, `w_dec`). No config comes with them:
the sizes are the arrays', the hook point is read off the release's names
(`hookedattn.sae.releases._naming`), and an SAE at `attn.hook_z` reads the heads' z
flattened, as SAELens reads it. An embedding SAE (`hook_embed`) is rescaled exactly as
SAELens's loader rescales it, `W_enc / sqrt(d_in)` and `W_dec * sqrt(d_in)` (for Gemma's
`sqrt(d_model)` embedding scale), so that it is the SAE SAELens loads. A `scaling_factor` of
ones, which SAELens
drops, is allowed; any other is refused, as is anything else that is not one of the arrays.
"""

import math
from pathlib import Path
from typing import Any

import torch

from hookedattn.sae import _io, _npz, _strict
from hookedattn.sae.config import DTYPES, SAEConfig

FILES = {"gemma_scope": "params.npz", "gemma_scope_2": "params.safetensors"}
_STORED = {
    "gemma_scope": {n: n for n in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold")},
    "gemma_scope_2": {"W_enc": "w_enc", "W_dec": "w_dec", "b_enc": "b_enc", "b_dec": "b_dec",
                      "threshold": "threshold"},
}  # fmt: skip
_ALLOWED_EXTRA = {"scaling_factor"}


def load(cls: type, folder: Path, format: str, hook: str | None) -> Any:
    """The SAE (a `cls`) in a Gemma Scope folder of `format`, at `hook`; every array is
    checked in the file's header before any is read."""
    file = folder / FILES[format]
    if not hook:
        raise ValueError(
            f"{file}: Gemma Scope files name no hook point, and this SAE's release and folder "
            f"names do not say which one it reads"
        )
    found = _npz.headers(file) if format == "gemma_scope" else _strict.tensor_shapes(file)
    stored = _STORED[format]
    missing = sorted(s for s in stored.values() if s not in found)
    extra = sorted(set(found) - set(stored.values()) - _ALLOWED_EXTRA)
    if missing or extra:
        raise ValueError(
            f"{file} is not a Gemma Scope JumpReLU SAE: it lacks {missing} / holds {extra} "
            f"(expected {sorted(stored.values())})"
        )
    shape, _ = found[stored["W_enc"]]
    if len(shape) != 2:
        raise ValueError(f"{file}: {stored['W_enc']} has shape {shape}, expected [d_in d_sae]")
    d_in, d_sae = shape
    expected = {"W_enc": (d_in, d_sae), "W_dec": (d_sae, d_in), "b_enc": (d_sae,),
                "b_dec": (d_in,), "threshold": (d_sae,)}  # fmt: skip
    for name, want in expected.items():
        if found[stored[name]][0] != want:
            raise ValueError(
                f"{file}: {stored[name]} has shape {found[stored[name]][0]}, expected {want} "
                f"for W_enc's d_in={d_in}, d_sae={d_sae}"
            )
    kinds = {str(dtype).removeprefix("torch.") for _, dtype in found.values()}
    if len(kinds) != 1 or not kinds <= set(DTYPES):
        raise ValueError(f"{file}: the arrays must share one dtype of {tuple(DTYPES)}: {kinds}")
    names = [stored[n] for n in expected] + sorted(_ALLOWED_EXTRA & set(found))
    raw = _npz.read(file, names) if format == "gemma_scope" else _strict.load_finite(file, names)
    tensors = {ours: raw[theirs] for ours, theirs in stored.items()}
    _check(file, tensors, raw.get("scaling_factor"))
    if hook == "hook_embed":  # SAELens's gemma_2 loader: see the module docstring
        tensors["W_enc"] = tensors["W_enc"] / math.sqrt(d_in)
        tensors["W_dec"] = tensors["W_dec"] * math.sqrt(d_in)
    reshape = "hook_z" if hook.endswith("hook_z") else "none"
    cfg = SAEConfig(d_in, d_sae, hook, "jumprelu", pre_bias="none", dtype=kinds.pop(), seed=None,
                    reshape_activations=reshape)  # fmt: skip
    sae = cls(cfg)
    _io._fill(sae, tensors)
    return sae


def _check(file: Path, tensors: dict[str, torch.Tensor], scaling: torch.Tensor | None) -> None:
    for name, tensor in tensors.items():
        bad = int((~tensor.isfinite()).sum())
        if bad:
            raise ValueError(f"{file}: {name} holds {bad} NaN or infinite value(s)")
    if scaling is not None and not bool((scaling == 1).all()):
        raise ValueError(
            f"{file} holds a scaling_factor other than ones (a finetuning scale), which is not "
            f"supported (SAELens reads it only with finetuning_scaling_factor set)"
        )
