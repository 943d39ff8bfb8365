"""Saving and loading models: safetensors weights plus a JSON config, never pickle.

A checkpoint is a directory holding `config.json` and `model.safetensors`. Loading checks
that every tensor the config implies is present with the right shape and that nothing else
is, and names what is wrong when it is not.
"""

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from hookedattn.config import HookedTransformerConfig

if TYPE_CHECKING:
    from hookedattn.model import HookedTransformer

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"


class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated, or does not match its config."""


def save(
    model: "HookedTransformer", path: str | Path, metadata: dict[str, Any] | None = None
) -> Path:
    """Write `config.json` (plus optional `metadata`) and `model.safetensors` into `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    config = {"config": model.cfg.to_dict(), **({"metadata": metadata} if metadata else {})}
    (path / CONFIG_FILE).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    tensors = {name: t.detach().contiguous().cpu() for name, t in model.state_dict().items()}
    save_file(tensors, str(path / WEIGHTS_FILE))
    return path


def read_config(path: str | Path) -> tuple[HookedTransformerConfig, dict[str, Any]]:
    """The config and metadata stored in a checkpoint directory."""
    path = Path(path)
    config_path = path / CONFIG_FILE
    if not config_path.is_file():
        raise CheckpointError(f"no {CONFIG_FILE} in {path}: not a hookedattn checkpoint")
    try:
        data = json.loads(config_path.read_text())
        config = HookedTransformerConfig.from_dict(data["config"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{config_path} is not a valid config: {error}") from error
    return config, data.get("metadata", {})


def load(
    cls: type["HookedTransformer"], path: str | Path, device: str | None = None
) -> "HookedTransformer":
    """Build a model from a checkpoint directory, checking every tensor against the config."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    config, _ = read_config(path)
    if device is not None:
        config = config.replace(device=device)
    weights_path = path / WEIGHTS_FILE
    if not weights_path.is_file():
        raise CheckpointError(f"no {WEIGHTS_FILE} in {path}")
    try:
        tensors = load_file(str(weights_path), device=config.device)
    except (SafetensorError, OSError, RuntimeError) as error:
        raise CheckpointError(
            f"{weights_path} cannot be read (truncated or corrupted?): {error}"
        ) from error
    model = cls(config)
    load_checked_state_dict(model, tensors, source=str(weights_path))
    return model


def load_checked_state_dict(
    model: torch.nn.Module, tensors: dict[str, torch.Tensor], source: str = "state dict"
) -> None:
    """Copy `tensors` into `model`, first checking names and shapes; nothing is half-loaded."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    extra = sorted(set(tensors) - set(expected))
    wrong = [
        f"{name}: {tuple(tensors[name].shape)} instead of {tuple(t.shape)}"
        for name, t in expected.items()
        if name in tensors and tensors[name].shape != t.shape
    ]
    problems = []
    if missing:
        problems.append(f"missing {missing}")
    if extra:
        problems.append(f"unexpected {extra}")
    if wrong:
        problems.append(f"wrong shapes {wrong}")
    if problems:
        raise CheckpointError(f"{source} does not match the config: " + "; ".join(problems))
    with torch.no_grad():
        for name, param in expected.items():
            param.copy_(tensors[name].to(param.dtype))
