"""Training a small `HookedTransformer` on bytes: AdamW, warmup + cosine, clipping, checkpoints.

`train(model, corpus, cfg, run_dir)` runs `cfg.steps` optimizer steps. Every batch is a pure
function of `(cfg.seed, step)`, and the model's initial weights of its config's seed, so a
run is deterministic on the CPU (for a fixed number of threads) and a run interrupted and
resumed from its last checkpoint ends with the weights of an uninterrupted one.
"""

import dataclasses
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor
from tqdm import tqdm

from hookedattn.core import parallel
from hookedattn.core.model import HookedTransformer
from hookedattn.training.checkpoints import RunState, latest_checkpoint, resume, save_checkpoint
from hookedattn.training.config import TrainConfig, learning_rate
from hookedattn.training.corpus import ByteCorpus, repeated_random_tokens, text_windows
from hookedattn.training.evaluation import Evaluation, evaluate


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


def training_batch(
    corpus: ByteCorpus, cfg: TrainConfig, step: int, seq_len: int
) -> Int[Tensor, "batch pos"]:
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


def _progress_bar(cfg: TrainConfig, start: int, tokens_per_step: int, enabled: bool) -> tqdm:
    # In a log file (not a terminal) a redraw every 30 s keeps the log short.
    interactive = sys.stderr.isatty()
    return tqdm(
        total=cfg.steps * tokens_per_step,
        initial=start * tokens_per_step,
        unit="tok",
        unit_scale=True,
        disable=not enabled,
        mininterval=0.5 if interactive else 30.0,
        dynamic_ncols=interactive,
        file=sys.stderr,
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
    `on_checkpoint(step, path)` is called after each is written. `progress` shows a `tqdm`
    bar (tokens/s, loss, learning rate) and the evaluations on stderr.
    """
    parallel.refuse_tensor_parallel(
        model,
        "training the model's own weights (hookedattn.training.train)",
        "its gradient-norm clipping would read each rank's slices as the whole and its "
        "checkpoints each rank's optimizer state; SAE and transcoder training on a store "
        "that the split model collected do work",
    )
    run_dir = None if run_dir is None else Path(run_dir)
    optimizer = make_optimizer(model, cfg)
    state = RunState(step=0, history=[], train_seconds=0.0, cpu_seconds=0.0)
    latest = None if run_dir is None else latest_checkpoint(run_dir)
    if latest is not None:
        state = resume(model, optimizer, cfg, latest)
    resumed_from = None if latest is None else state.step
    tokens_per_step = cfg.batch_size * model.cfg.n_ctx
    bar = _progress_bar(cfg, state.step, tokens_per_step, progress)
    say = bar.write if progress else (lambda text, file=None: None)  # tqdm.write ignores disable
    if latest is not None:
        say(f"resuming from {latest}", file=sys.stderr)

    def checkpoint() -> None:
        if run_dir is not None:
            path = save_checkpoint(run_dir, model, optimizer, cfg, state, metadata)
            if on_checkpoint is not None:
                on_checkpoint(state.step, path)

    model.train()
    try:
        _run_steps(model, optimizer, corpus, cfg, state, bar, say, checkpoint)
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


def _run_steps(
    model: HookedTransformer,
    optimizer: torch.optim.AdamW,
    corpus: ByteCorpus,
    cfg: TrainConfig,
    state: RunState,
    bar: tqdm,
    say: Callable[..., None],
    checkpoint: Callable[[], None],
) -> None:
    """Steps from `state.step` to `cfg.steps`, evaluating and checkpointing on the way; on
    Ctrl-C, a checkpoint to resume from unless the weights are mid-step."""
    tokens_per_step = cfg.batch_size * model.cfg.n_ctx
    started, cpu_started = time.perf_counter(), time.process_time()
    mid_step = False  # weights and optimizer state may disagree while a step runs
    try:
        while state.step < cfg.steps:
            step = state.step + 1
            mid_step = True
            loss = _train_step(model, optimizer, corpus, cfg, step)
            state.step, mid_step = step, False
            state.train_seconds += time.perf_counter() - started
            state.cpu_seconds += time.process_time() - cpu_started
            started, cpu_started = time.perf_counter(), time.process_time()
            bar.update(tokens_per_step)
            lr = f"{learning_rate(step, cfg):.2e}"
            bar.set_postfix(step=step, loss=f"{loss:.3f}", lr=lr, refresh=False)
            if step % cfg.eval_every == 0 or step == cfg.steps:
                state.history.append(evaluate(model, corpus, cfg, step))
                say(repr(state.history[-1]), file=sys.stderr)
            if step % cfg.checkpoint_every == 0 or step == cfg.steps:
                checkpoint()
    except KeyboardInterrupt:
        if mid_step:
            say(f"interrupted during step {state.step + 1}: resume from the last checkpoint")
        else:
            say(f"interrupted after step {state.step}: saving a checkpoint to resume from")
            checkpoint()
        raise


def _train_step(
    model: HookedTransformer,
    optimizer: torch.optim.AdamW,
    corpus: ByteCorpus,
    cfg: TrainConfig,
    step: int,
) -> float:
    tokens = training_batch(corpus, cfg, step, model.cfg.n_ctx)
    for group in optimizer.param_groups:
        group["lr"] = learning_rate(step, cfg)
    loss = model(tokens, return_type="loss")
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
    optimizer.step()
    return loss.item()
