"""TransformerLens's own toy models: its config fields and its state dicts, read safely.

`attn-only-1l..4l`, `gelu-1l..4l` and `solu-1l..12l` (`NeelNanda/Attn_Only_2L512W_C4_Code`,
...) are stored on the hub as TransformerLens wrote them: a `config.json` of TL's training
fields (`n_layers`, `d_model`, `act_fn`, `normalization` or `normalization_type`,
`shortformer_pos`, `tokenizer_name`, ...) and a state dict with TL's parameter names,
pickled (`model_final.pth`, checkpoints as `checkpoints/NAME_STEP.pth`). The names are
ours too, so the state dict loads as it is; the pickle is read with
`torch.load(weights_only=True)`, which rebuilds tensors and refuses anything else (no
code from the file runs). The config is translated as TransformerLens 3.5.1 translates it
(`convert_neel_model_config`): only the architecture fields, with TL's defaults for the
rest (`eps=1e-5`).
"""

import re
from pathlib import Path
from typing import Any

import torch

from hookedattn.core._weights_io import CheckpointError, TensorHeader, check_state_dict
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hub._names import checkpoint_step

# Buffers TransformerLens saves with its parameters (the causal mask, the masked score,
# rotary tables): rebuilt from the config here, so they are dropped on reading.
_BUFFERS = re.compile(r".*\.(mask|IGNORE|rotary_sin|rotary_cos)$")
_CHECKPOINT = re.compile(r"(?:.*/)?checkpoints/.*_(\d+)\.pth$")
FINAL_PATTERN = "*final.pth"
# The architectures TransformerLens reads from these repos; "neel" is every current one.
ARCHITECTURES = ("neel",)


def read_config(folder: Path, name: str) -> tuple[HookedTransformerConfig, str | None]:
    """Our config for the TL-format model in `folder`, and the repo of its tokenizer."""
    from hookedattn.core.hf._loading import read_json

    data = read_json(folder / "config.json")
    architecture = data.get("architecture", "neel-solu-old" if "_old" in name else "neel")
    if architecture not in ARCHITECTURES:
        raise CheckpointError(
            f"{name} is a TransformerLens model of architecture {architecture!r}, whose "
            f"weights TL converts with code of their own; hookedattn reads {ARCHITECTURES} "
            f"(attn-only-*, gelu-*, solu-*)"
        )
    if data.get("final_rms"):
        raise CheckpointError(
            f"{name} ends in an RMS norm (final_rms=True), which hookedattn does not build"
        )
    try:
        normalization = (
            data["normalization"] if "normalization" in data else data["normalization_type"]
        )
        attn_only = bool(data["attn_only"])
        cfg = HookedTransformerConfig(
            n_layers=data["n_layers"],
            d_model=data["d_model"],
            n_ctx=data["n_ctx"],
            d_vocab=data["d_vocab"],
            n_heads=data["n_heads"],
            d_head=data["d_head"],
            d_mlp=data["d_mlp"],
            act_fn=data["act_fn"],
            attn_only=attn_only,
            normalization_type=normalization,
            positional_embedding_type=(
                "shortformer" if data.get("shortformer_pos") else "standard"
            ),
            model_name=name.split("/")[-1],
            original_architecture=architecture,
            init_weights=False,
        )
    except KeyError as error:
        raise CheckpointError(
            f"{folder / 'config.json'} lacks {error.args[0]!r}, which a TransformerLens "
            f"model config has"
        ) from None
    except (TypeError, ValueError) as error:
        raise CheckpointError(f"{folder / 'config.json'}: {error}") from error
    tokenizer = data.get("tokenizer_name")
    return cfg, tokenizer if isinstance(tokenizer, str) and tokenizer else None


def checkpoint_steps(files: list[str]) -> dict[int, str]:
    """The training step of each checkpoint file among `files` (repo paths), by step."""
    steps = {}
    for file in files:
        match = _CHECKPOINT.fullmatch(file)
        if match:
            steps[int(match.group(1))] = file
    return dict(sorted(steps.items()))


def checkpoint_file(
    files: list[str], name: str, checkpoint_index: int | None, checkpoint_value: int | None
) -> str:
    """The file of the checkpoint `checkpoint_value` names or `checkpoint_index` indexes
    (the steps in increasing order), among the repo's `files`."""
    steps = checkpoint_steps(files)
    if not steps:
        raise ValueError(f"{name} has no checkpoints (no checkpoints/*_STEP.pth files)")
    step = checkpoint_step(tuple(steps), name, checkpoint_index, checkpoint_value)
    return steps[step]


def final_file(folder: Path) -> Path:
    """The final weights in `folder`: its one top-level `*final.pth`."""
    found = sorted(folder.glob(FINAL_PATTERN))
    if not found:
        raise CheckpointError(f"no {FINAL_PATTERN} in {folder}: not a TransformerLens model")
    return found[0]


def read_state_dict(path: Path) -> dict[str, torch.Tensor]:
    """The parameters in a TL state-dict file, without its buffers: read with
    `weights_only=True` (tensors and containers only) and memory-mapped."""
    if not path.is_file():
        raise CheckpointError(f"{path} is not a regular file")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:
        raise CheckpointError(
            f"{path} is not a state dict that loads without running code "
            f"(torch.load(weights_only=True) refused it: {error})"
        ) from error
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in state.items()
    ):
        raise CheckpointError(f"{path} does not hold a state dict (names to tensors)")
    return {name: t for name, t in state.items() if not _BUFFERS.fullmatch(name)}


def load(
    cls: type,
    folder: Path,
    weights: Path,
    *,
    name: str,
    dtype: torch.dtype | str | None,
    device: str | None,
    tokenizer: Any,
    **placement: Any,
) -> Any:
    """A `cls` (HookedTransformer) of the TL-format model: `folder`'s config, `weights`'s
    parameters, converted to `dtype` (default: as stored) on `device` (default: cpu)."""
    from hookedattn.core import parallel

    cfg, _ = read_config(folder, name)
    state = read_state_dict(weights)
    floating = [t.dtype for t in state.values() if t.is_floating_point()]
    stored = floating[0] if floating else torch.float32
    cfg = cfg.replace(dtype=stored if dtype is None else dtype, device=device or "cpu")
    header = {k: TensorHeader(tuple(t.shape), t.dtype) for k, t in state.items()}
    return parallel.build_model(
        cls,
        cfg,
        lambda key, part, where: _part(state[key], part).to(where, cfg.dtype, copy=True),
        tokenizer=tokenizer,
        check=lambda model: check_state_dict(model, header, str(weights)),
        **placement,
    )


def _part(tensor: torch.Tensor, part: Any) -> torch.Tensor:
    if part is None:
        return tensor
    return tensor.narrow(part.axis, part.start, part.stop - part.start)
