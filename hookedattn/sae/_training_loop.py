"""What the training loops of SAEs (`training.py`) and transcoders
(`transcoder_training.py`) share: their batches, drawn epoch after epoch and checked finite,
and what a logged step measured and how it is reported."""

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor


@dataclasses.dataclass(frozen=True)
class TrainingStep:
    """What one logged step measured, on its own batch of normalised rows."""

    step: int
    tokens: int
    loss: float
    l0: float
    fve: float
    dead: int


def epochs(
    store: Any, names: list[str], batch_size: int, seed: int, steps: int
) -> Iterator[tuple[Tensor, ...]]:
    """`steps` full batches of each of `names`, row-aligned, epoch after epoch, each epoch
    in its own shuffled order (seeded `seed + epoch`); a batch holding NaN or infinite
    values is refused, naming its step, epoch and name."""
    if len(store) < batch_size:
        of = f" of {names[0]}" if len(names) == 1 else ""
        raise ValueError(
            f"the store holds {len(store)} rows{of}, fewer than one batch of {batch_size}"
        )
    step, epoch = 0, 0
    while True:
        streams = [store.batches(n, batch_size, shuffle=True, seed=seed + epoch, drop_last=True)
                   for n in names]  # fmt: skip
        for batches in zip(*streams, strict=True):
            for name, batch in zip(names, batches, strict=True):
                if not bool(torch.isfinite(batch).all()):
                    raise ValueError(
                        f"batch {step} (epoch {epoch}) of {name} in the store {store.path} holds "
                        f"NaN or infinite values: the model produced them there, or the store "
                        f"is damaged"
                    )
            yield batches
            step += 1
            if step == steps:
                return
        epoch += 1


def report(bar: Any, log: list[TrainingStep] | None, record: TrainingStep) -> None:
    """Show a step's numbers on the progress bar, and keep them in `log` if given."""
    bar.set_postfix(loss=f"{record.loss:.3g}", L0=f"{record.l0:.1f}",
                    FVE=f"{record.fve:.3f}", dead=record.dead)  # fmt: skip
    if log is not None:
        log.append(record)
