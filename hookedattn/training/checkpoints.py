"""Training checkpoints: written atomically, listed, and resumed from bit for bit.

A checkpoint is a `model.save` directory `run_dir/checkpoints/step-000123/` whose
`config.json` metadata holds the step, the evaluations so far, the training config and the
corpus manifest; the newest one also holds `optimizer.safetensors` (AdamW's moments), which
is what resuming needs.
"""

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from hookedattn.core import CONFIG_FILE, CheckpointError, read_config
from hookedattn.core.model import HookedTransformer
from hookedattn.training.config import TrainConfig
from hookedattn.training.evaluation import Evaluation

OPTIMIZER_FILE = "optimizer.safetensors"
CHECKPOINTS_DIR = "checkpoints"


@dataclasses.dataclass
class RunState:
    """Where a run stands: its step, evaluations so far, and the seconds it has taken."""

    step: int
    history: list[Evaluation]
    train_seconds: float
    cpu_seconds: float


def checkpoint_dir(run_dir: str | Path, step: int) -> Path:
    """Where the checkpoint of `step` lives in `run_dir`."""
    return Path(run_dir) / CHECKPOINTS_DIR / f"step-{step:06d}"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """The `(step, path)` of each complete checkpoint in `run_dir`, by step."""
    found = []
    for path in (Path(run_dir) / CHECKPOINTS_DIR).glob("step-*"):
        complete = (path / CONFIG_FILE).is_file()
        if complete and path.name[5:].isdigit():
            found.append((int(path.name[5:]), path))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    """The newest checkpoint that can be resumed from (it has optimizer state), or None."""
    for _, path in reversed(list_checkpoints(run_dir)):
        if (path / OPTIMIZER_FILE).is_file():
            return path
    return None


def save_checkpoint(
    run_dir: Path,
    model: HookedTransformer,
    optimizer: torch.optim.AdamW,
    cfg: TrainConfig,
    state: RunState,
    metadata: dict[str, Any] | None,
) -> Path:
    """Write the checkpoint of `state.step`; only the newest keeps the optimizer state."""
    path = checkpoint_dir(run_dir, state.step)
    record = {
        **(metadata or {}),
        "step": state.step,
        "tokens_seen": state.step * cfg.batch_size * model.cfg.n_ctx,
        "train_seconds": round(state.train_seconds, 1),
        "cpu_seconds": round(state.cpu_seconds, 1),
        "train_config": cfg.to_dict(),
        "history": [dataclasses.asdict(e) for e in state.history],
    }
    # Written into a temporary directory and renamed, so a kill mid-write leaves no
    # half-checkpoint that resuming would pick up.
    partial = path.with_name(path.name + ".partial")
    model.save(partial, metadata=record)
    save_file(_optimizer_tensors(model, optimizer), str(partial / OPTIMIZER_FILE))
    if path.exists():
        _remove_checkpoint(path)
    partial.rename(path)
    for _, older in list_checkpoints(run_dir):
        if older != path:
            (older / OPTIMIZER_FILE).unlink(missing_ok=True)
    return path


def _remove_checkpoint(path: Path) -> None:
    for file in path.iterdir():
        file.unlink()
    path.rmdir()


def _optimizer_tensors(model: HookedTransformer, optimizer: torch.optim.AdamW) -> dict:
    tensors = {}
    for name, param in model.named_parameters():
        for key, value in optimizer.state.get(param, {}).items():
            tensors[f"{name}/{key}"] = value.detach().clone().contiguous()
    return tensors


def resume(
    model: HookedTransformer, optimizer: torch.optim.AdamW, cfg: TrainConfig, path: Path
) -> RunState:
    """Load the weights and optimizer state of checkpoint `path` in place; its `RunState`.

    The checkpoint must be of the same model config and `TrainConfig`, or resuming would
    silently continue another run.
    """
    saved_cfg, record = read_config(path)
    if saved_cfg != model.cfg:
        raise ValueError(
            f"the checkpoint {path} is of a different model; resume with the same model "
            f"config, or train into a new run directory"
        )
    if record.get("train_config") != json.loads(json.dumps(cfg.to_dict())):
        raise ValueError(
            f"the checkpoint {path} was trained with a different TrainConfig "
            f"({record.get('train_config')}); resume with the same one, or use a new run directory"
        )
    loaded = HookedTransformer.load(path, device=model.cfg.device)
    model.load_state_dict(loaded.state_dict())
    try:
        tensors = load_file(str(path / OPTIMIZER_FILE))
    except (SafetensorError, OSError) as error:
        raise CheckpointError(f"{path / OPTIMIZER_FILE} cannot be read: {error}") from error
    for name, param in model.named_parameters():
        keys = [k for k in tensors if k.startswith(name + "/")]
        optimizer.state[param] = {k.split("/", 1)[1]: tensors[k] for k in keys}
    history = [Evaluation(**e) for e in record.get("history", [])]
    return RunState(
        step=record["step"],
        history=history,
        train_seconds=float(record.get("train_seconds", 0.0)),
        cpu_seconds=float(record.get("cpu_seconds", 0.0)),
    )
