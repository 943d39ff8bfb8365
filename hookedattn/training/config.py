"""How a shipped model is trained: `TrainConfig`, and the learning-rate schedule it implies."""

import dataclasses
import math
from typing import Any


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


def learning_rate(step: int, cfg: TrainConfig) -> float:
    """The learning rate of optimizer step `step` (1-based): linear warmup, then cosine."""
    if step <= cfg.warmup_steps:
        return cfg.lr * step / cfg.warmup_steps
    progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return cfg.lr * (cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * cosine)
