"""Training a small `HookedTransformer` on bytes: AdamW, warmup + cosine, clipping, checkpoints.

`train(model, corpus, cfg, run_dir)` runs `cfg.steps` optimizer steps. Every batch is a pure
function of `(cfg.seed, step)`, and the model's initial weights of its config's seed, so a
run is deterministic on the CPU (for a fixed number of threads) and a run interrupted and
resumed from its last checkpoint ends with the weights of an uninterrupted one.

A checkpoint is a `weights_io` directory `run_dir/checkpoints/step-000123/` whose
`config.json` metadata holds the step, the evaluations so far, the training config and the
corpus manifest; the newest one also holds `optimizer.safetensors` (AdamW's moments), which
is what resuming needs. The presets of the shipped models are in `hookedattn.presets`.
"""

import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Int
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch import Tensor

from hookedattn import weights_io
from hookedattn.corpus import ByteCorpus, heldout_windows, repeated_random_tokens, text_windows
from hookedattn.model import HookedTransformer
from hookedattn.progress import Progress

OPTIMIZER_FILE = "optimizer.safetensors"
CHECKPOINTS_DIR = "checkpoints"
_EVAL_SEED_OFFSET = 7_919  # eval data comes from its own stream, never a training batch's


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """How to train: optimizer, schedule, data mixture, evaluation and checkpoint cadence.

    The learning rate rises linearly over `warmup_steps`, then follows a cosine down to
    `lr * min_lr_ratio` at `steps`. A fraction `synthetic_fraction` of each batch is
    repeated random tokens with a period drawn from `synthetic_period` (inclusive).
    """

    steps: int = 4000
    batch_size: int = 32
    lr: float = 3e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = 1.0
    synthetic_fraction: float = 0.5
    synthetic_period: tuple[int, int] = (8, 63)
    eval_every: int = 50
    eval_seqs: int = 64
    checkpoint_every: int = 100
    seed: int = 0

    def __post_init__(self) -> None:
        for field in ("steps", "batch_size", "eval_every", "eval_seqs", "checkpoint_every"):
            value = getattr(self, field)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{field} must be an int >= 1, got {value!r}")
        if not isinstance(self.warmup_steps, int) or self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be an int >= 0, got {self.warmup_steps!r}")
        if not 0.0 <= self.synthetic_fraction <= 1.0:
            raise ValueError(f"synthetic_fraction must be in [0, 1], got {self.synthetic_fraction}")
        object.__setattr__(self, "betas", tuple(self.betas))
        object.__setattr__(self, "synthetic_period", tuple(self.synthetic_period))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; `TrainConfig(**d)` rebuilds the config."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """Losses (nats per token) at one step, on data no training batch contains.

    `heldout_loss`: held-out stdlib files. `icl_score`: held-out loss late in the context
    minus early in it (Olsson et al. 2022: negative when the context helps).
    `repeat_first`/`repeat_second`: loss on the first and second copy of a repeated
    random sequence (ln 256 = 5.55 for a model that cannot use the repeat).
    """

    step: int
    heldout_loss: float
    icl_score: float
    repeat_first: float
    repeat_second: float

    def __repr__(self) -> str:
        return (
            f"step {self.step}: held-out {self.heldout_loss:.3f}, icl {self.icl_score:+.3f}, "
            f"repeat {self.repeat_first:.2f} -> {self.repeat_second:.2f}"
        )


@dataclasses.dataclass(frozen=True)
class TrainResult:
    """What a finished `train` call did: the final step, evaluations, time, where it began."""

    step: int
    tokens_seen: int
    history: tuple[Evaluation, ...]
    train_seconds: float
    cpu_seconds: float
    resumed_from: int | None

    def __repr__(self) -> str:
        resumed = f", resumed from step {self.resumed_from}" if self.resumed_from else ""
        last = f", {self.history[-1]!r}" if self.history else ""
        return (
            f"TrainResult({self.step} steps, {self.train_seconds:.0f} s wall, "
            f"{self.cpu_seconds:.0f} s CPU{resumed}{last})"
        )


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """The learning rate of optimizer step `step` (1-based): linear warmup, then cosine."""
    if step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine)


def training_batch(corpus: ByteCorpus, cfg: TrainConfig, step: int, seq_len: int) -> Tensor:
    """The batch of step `step`: a pure function of `(cfg.seed, step)`, so resuming is exact."""
    generator = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
    n_synthetic = round(cfg.batch_size * cfg.synthetic_fraction)
    text = text_windows(corpus.train, cfg.batch_size - n_synthetic, seq_len, generator)
    if n_synthetic == 0:
        return text
    synthetic = repeated_random_tokens(n_synthetic, seq_len, cfg.synthetic_period, generator)
    return torch.cat([text, synthetic])


def make_optimizer(model: HookedTransformer, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on matrices only (biases and norm gains are not decayed)."""
    named = list(model.named_parameters())
    groups = [
        {"params": [p for _, p in named if p.ndim >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for _, p in named if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas)


@torch.no_grad()
def evaluate(
    model: HookedTransformer, corpus: ByteCorpus, cfg: TrainConfig, step: int
) -> Evaluation:
    """Held-out loss, in-context-learning score and repeated-sequence losses at `step`."""
    n_ctx = model.cfg.n_ctx
    text = heldout_windows(corpus.heldout, cfg.eval_seqs, n_ctx)
    per_token = model(text, return_type="loss", loss_per_token=True).mean(0)
    early, late = per_token[n_ctx // 16 : 3 * n_ctx // 16], per_token[3 * n_ctx // 4 :]
    generator = torch.Generator().manual_seed(cfg.seed + _EVAL_SEED_OFFSET)
    half = (n_ctx - 1) // 2
    repeated = repeated_random_tokens(cfg.eval_seqs, 2 * half + 1, half, generator)
    # Prediction i is of token i + 1; the second copy's tokens are half + 1 .. 2 * half.
    repeat_loss = model(repeated, return_type="loss", loss_per_token=True).mean(0)
    return Evaluation(
        step=step,
        heldout_loss=per_token.mean().item(),
        icl_score=(late.mean() - early.mean()).item(),
        repeat_first=repeat_loss[1:half].mean().item(),
        repeat_second=repeat_loss[half:].mean().item(),
    )


def train(
    model: HookedTransformer,
    corpus: ByteCorpus,
    cfg: TrainConfig,
    run_dir: str | Path | None = None,
    *,
    metadata: dict[str, Any] | None = None,
    progress: bool = True,
    on_checkpoint: Callable[[int, Path], None] | None = None,
) -> TrainResult:
    """Train `model` in place for `cfg.steps` steps, resuming from `run_dir`'s last checkpoint.

    Checkpoints go to `run_dir/checkpoints/` every `cfg.checkpoint_every` steps, at the last
    step, and when the run is interrupted (Ctrl-C); `metadata` is stored with each.
    `on_checkpoint(step, path)` is called after each is written.
    """
    run_dir = None if run_dir is None else Path(run_dir)
    optimizer = make_optimizer(model, cfg)
    state = _RunState(step=0, history=[], train_seconds=0.0, cpu_seconds=0.0)
    resumed_from = None
    latest = None if run_dir is None else latest_checkpoint(run_dir)
    if latest is not None:
        state = _resume(model, optimizer, cfg, latest)
        resumed_from = state.step
        if progress:
            print(f"resuming from {latest}", file=sys.stderr)
    tokens_per_step = cfg.batch_size * model.cfg.n_ctx
    bar = Progress(cfg.steps, start=state.step, unit_scale=tokens_per_step, enabled=progress)

    def checkpoint() -> None:
        if run_dir is not None:
            path = save_checkpoint(run_dir, model, optimizer, cfg, state, metadata)
            if on_checkpoint is not None:
                on_checkpoint(state.step, path)

    started, cpu_started = time.perf_counter(), time.process_time()
    mid_step = False  # weights and optimizer state may disagree while a step runs
    model.train()
    try:
        while state.step < cfg.steps:
            step = state.step + 1
            mid_step = True
            loss = _train_step(model, optimizer, corpus, cfg, step)
            state.step, mid_step = step, False
            state.train_seconds += time.perf_counter() - started
            state.cpu_seconds += time.process_time() - cpu_started
            started, cpu_started = time.perf_counter(), time.process_time()
            bar.update(step, loss=loss, lr=learning_rate(step, cfg))
            if step % cfg.eval_every == 0 or step == cfg.steps:
                state.history.append(evaluate(model, corpus, cfg, step))
                bar.note(repr(state.history[-1]))
            if step % cfg.checkpoint_every == 0 or step == cfg.steps:
                checkpoint()
    except KeyboardInterrupt:
        if mid_step:
            bar.note(f"interrupted during step {state.step + 1}: resume from the last checkpoint")
        else:
            bar.note(f"interrupted after step {state.step}: saving a checkpoint to resume from")
            checkpoint()
        raise
    finally:
        bar.close()
        model.eval()
    return TrainResult(
        step=state.step,
        tokens_seen=state.step * tokens_per_step,
        history=tuple(state.history),
        train_seconds=state.train_seconds,
        cpu_seconds=state.cpu_seconds,
        resumed_from=resumed_from,
    )


def _train_step(
    model: HookedTransformer,
    optimizer: torch.optim.AdamW,
    corpus: ByteCorpus,
    cfg: TrainConfig,
    step: int,
) -> float:
    tokens: Int[Tensor, "batch pos"] = training_batch(corpus, cfg, step, model.cfg.n_ctx)
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step, cfg)
    loss = model(tokens, return_type="loss")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()
    return loss.item()


# ---------------------------------------------------------------------- checkpoints
@dataclasses.dataclass
class _RunState:
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
        complete = (path / weights_io.CONFIG_FILE).is_file()
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
    state: _RunState,
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
    weights_io.save(model, partial, metadata=record)
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


def _resume(
    model: HookedTransformer, optimizer: torch.optim.AdamW, cfg: TrainConfig, path: Path
) -> _RunState:
    saved_cfg, record = weights_io.read_config(path)
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
        raise weights_io.CheckpointError(
            f"{path / OPTIMIZER_FILE} cannot be read: {error}"
        ) from error
    for name, param in model.named_parameters():
        keys = [k for k in tensors if k.startswith(name + "/")]
        optimizer.state[param] = {k.split("/", 1)[1]: tensors[k] for k in keys}
    history = [Evaluation(**e) for e in record.get("history", [])]
    return _RunState(
        step=record["step"],
        history=history,
        train_seconds=float(record.get("train_seconds", 0.0)),
        cpu_seconds=float(record.get("cpu_seconds", 0.0)),
    )
