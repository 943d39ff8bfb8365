"""Training an SAE on the rows of an `ActivationStore`.

    sae = train_sae(store, "blocks.1.hook_resid_pre", d_sae=512, l1=5.0, steps=2000)

The inputs are normalised with the store's statistics: centred on the per-feature mean and
divided by one scalar, the root of the mean per-feature variance, so that a row's squared
norm is `d_in` on average and `l1` means the same at every layer and model. One scalar,
not a per-feature scale, because a per-feature one would change which directions count
as large and would not keep decoder rows at unit norm once folded back. The normalisation
is folded into the weights at the end (`_fold`), so the SAE returned reads the activations
as the model computes them.

Loss: `|x - recons|^2` (summed over `d_in`, averaged over rows) plus, for ReLU SAEs, `l1 ·
Σ_f acts_f |W_dec[f]|`; for JumpReLU SAEs `l0` times the number of active features, its
thresholds learnt by a straight-through estimator; a TopK SAE has no penalty (the
penalties in `hookedattn.sae._objectives`). After each Adam step the decoder rows are
renormalised to unit norm. A feature is dead when it has not fired in the last
`dead_window` steps; with `resample_every`, dead features are resampled towards inputs the
SAE reconstructs badly (`hookedattn.sae._resampling`). Everything random (initial
weights, batch order) comes from `seed`, so a run is repeatable.
"""

import copy
import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from hookedattn.sae import _objectives
from hookedattn.sae._resampling import resample_dead
from hookedattn.sae._training_loop import TrainingStep, epochs, report
from hookedattn.sae.autoencoder import SparseAutoencoder
from hookedattn.sae.config import SAEConfig


def train_sae(
    store: Any,
    name: str,
    *,
    d_sae: int,
    steps: int,
    l1: float | None = None,
    k: int | None = None,
    l0: float | None = None,
    bandwidth: float = 0.05,
    threshold: float = 0.05,
    resample_every: int | None = None,
    batch_size: int = 1024,
    lr: float = 1e-3,
    seed: int = 0,
    dead_window: int = 100,
    log_every: int = 10,
    progress: bool = True,
    log: list[TrainingStep] | None = None,
    checkpoint_every: int | None = None,
    checkpoint_dir: str | Path | None = None,
) -> SparseAutoencoder:
    """Train an SAE on the rows `name` of `store` for `steps` Adam steps.

    One of: a ReLU SAE with `l1` (its penalty), a TopK SAE with `k`, or a JumpReLU SAE
    with `l0` (the coefficient of its L0 penalty; thresholds start at `threshold` and
    learn through a straight-through estimator of width `bandwidth`, both in the
    normalised units of the module docstring). `resample_every=n`: every n steps the dead
    features are resampled towards inputs of high loss (`hookedattn.sae._resampling`).
    Batches of `batch_size` rows are drawn shuffled, epoch after epoch. A `tqdm` bar shows
    loss, L0, fraction of variance explained and dead features every `log_every` steps
    (appended to `log` as `TrainingStep`s if given). `checkpoint_every=n` saves the SAE
    after every n steps (in the model's units) to `checkpoint_dir/step-000n`. Returns the
    SAE in float32, in the model's units.
    """
    _check_arguments(store, name, d_sae, steps, l1, k, l0, batch_size)
    _check_extras(lr, bandwidth, threshold, checkpoint_dir, resample_every=resample_every,
                  checkpoint_every=checkpoint_every, log_every=log_every,
                  dead_window=dead_window)  # fmt: skip
    mean, scale = _normalisation(store, name)
    sae = _new_sae(store, name, d_sae, l1, k, seed)
    objective = _objective(sae, l1, l0, bandwidth, threshold)
    schedule = _Schedule(steps, batch_size, seed, resample_every, dead_window, log_every,
                         checkpoint_every, checkpoint_dir)  # fmt: skip
    bar = tqdm(total=steps, disable=not progress, desc=f"SAE {name}", unit="step")
    batches = (batch for (batch,) in epochs(store, [name], batch_size, seed, steps))
    _train(sae, objective, torch.optim.Adam(sae.parameters(), lr=lr), batches, (mean, scale),
           schedule, bar, log)  # fmt: skip
    bar.close()
    _fold(sae, mean, scale)
    _check_finite(sae, steps, lr)
    return sae


@dataclasses.dataclass(frozen=True)
class _Schedule:
    """When a training run resamples, logs and saves (`train_sae`'s arguments)."""

    steps: int
    batch_size: int
    seed: int
    resample_every: int | None
    dead_window: int
    log_every: int
    checkpoint_every: int | None
    checkpoint_dir: str | Path | None


def _train(
    sae: SparseAutoencoder,
    objective: Any,
    optimizer: torch.optim.Optimizer,
    batches: Any,
    units: tuple[Tensor, float],
    run: _Schedule,
    bar: Any,
    log: list[TrainingStep] | None,
) -> None:
    """The training loop: one Adam step per batch of normalised rows (`units`: the mean
    and scale), dead features counted, resampled, logged and checkpointed as `run` says."""
    mean, scale = units
    since_fired = torch.zeros(sae.cfg.d_sae, dtype=torch.long)
    for step, batch in enumerate(batches):
        x = (batch.float() - mean) / scale
        loss, acts, recons = _step(sae, optimizer, x, objective)
        # Activations are never negative, so a column's max says whether it fired; this
        # is a tenth of the cost of (acts > 0).any(0), which would be a tenth of a step.
        since_fired = torch.where(acts.amax(0) > 0, 0, since_fired + 1)
        every = run.resample_every
        if every is not None and (step + 1) % every == 0 and step + 1 < run.steps:
            since_fired = _resampled(
                sae, optimizer, x, since_fired, run.dead_window, run.seed, step
            )
        if step % run.log_every == 0 or step == run.steps - 1:
            record = _measure(
                step, run.batch_size, loss, acts, x, recons, since_fired, run.dead_window
            )
            report(bar, log, record)
        _checkpoint(sae, mean, scale, step, run.checkpoint_every, run.checkpoint_dir)
        bar.update()


def _check_finite(sae: SparseAutoencoder, steps: int, lr: float) -> None:
    """Refuse to return an SAE whose training diverged (a NaN or inf parameter)."""
    bad = [n for n, p in sae.named_parameters() if not bool(p.detach().isfinite().all())]
    if bad:
        raise ValueError(
            f"training diverged: after {steps} steps the SAE's {', '.join(bad)} hold NaN or "
            f"infinite values; lower lr (was {lr:g}) or check the store's rows"
        )


def _normalisation(store: Any, name: str) -> tuple[Tensor, float]:
    """The mean subtracted from every row and the one scale it is divided by (the store's
    statistics): rows of unit mean square per dimension."""
    stats = store.stats(name)
    scale = float(stats.var.mean().sqrt())
    where = f"the store {getattr(store, 'path', store)}"
    if not math.isfinite(scale) or not bool(stats.mean.isfinite().all()):
        raise ValueError(
            f"{where} holds NaN or infinite values in the rows of {name} (their mean or "
            f"variance is not finite): the model produced them there, or the store is damaged"
        )
    if scale == 0:
        raise ValueError(
            f"the rows of {name} in {where} have no variance (every row is the same): there "
            f"is nothing for an SAE to learn; check that the model's activations there are "
            f"not constant"
        )
    return stats.mean.float(), scale


def _resampled(
    sae: SparseAutoencoder,
    optimizer: torch.optim.Optimizer,
    x: Tensor,
    since_fired: Tensor,
    dead_window: int,
    seed: int,
    step: int,
) -> Tensor:
    """Resample the features silent for `dead_window` steps; the steps since each fired."""
    dead = since_fired >= dead_window
    revived = resample_dead(sae, optimizer, x, dead, (seed << 32) + step)
    return torch.where(revived, 0, since_fired)


def _checkpoint(
    sae: SparseAutoencoder,
    mean: Tensor,
    scale: float,
    step: int,
    every: int | None,
    folder: str | Path | None,
) -> None:
    """Save the SAE (in the model's units) after every `every` steps, as `step-000n`."""
    if every is not None and (step + 1) % every == 0:
        _folded(sae, mean, scale).save(Path(folder) / f"step-{step + 1:06d}")


def _new_sae(
    store: Any, name: str, d_sae: int, l1: float | None, k: int | None, seed: int
) -> SparseAutoencoder:
    """The untrained SAE of the variant the arguments choose, sized for `name`'s rows."""
    (d_in,) = store.row_shape(name)
    activation = "relu" if l1 is not None else "topk" if k is not None else "jumprelu"
    return SparseAutoencoder(SAEConfig(d_in, d_sae, name, activation, k=k, seed=seed))


@dataclasses.dataclass(frozen=True)
class _Objective:
    """The activation used in training and the terms added to the squared error."""

    activate: Callable[[SparseAutoencoder, Tensor], Tensor]
    penalty: Callable[[SparseAutoencoder, Tensor, Tensor], Tensor]


def _objective(sae, l1, l0, bandwidth, threshold) -> _Objective:
    """The objective for the SAE's variant, chosen once before the loop."""
    if l1 is not None:
        return _Objective(_objectives.activate, _objectives.L1Penalty(l1))
    if l0 is not None:
        with torch.no_grad():
            sae.activation.threshold.fill_(threshold)
        activate = _objectives.JumpReLUActivation(bandwidth)
        return _Objective(activate, _objectives.L0Penalty(l0, bandwidth))
    return _Objective(_objectives.activate, _objectives.no_penalty)


def _step(
    sae: SparseAutoencoder,
    optimizer: torch.optim.Optimizer,
    x: Float[Tensor, "batch d_in"],
    objective: _Objective,
) -> tuple[Tensor, Float[Tensor, "batch d_sae"], Float[Tensor, "batch d_in"]]:
    """One Adam step on `x`; the loss, activations and reconstruction, detached."""
    pre = sae.pre_activations(x)
    acts = objective.activate(sae, pre)
    recons = sae.decode(acts)
    loss = (recons - x).pow(2).sum(-1).mean() + objective.penalty(sae, pre, acts)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    _constrain(sae)
    return loss.detach(), acts.detach(), recons.detach()


def _folded(
    sae: SparseAutoencoder, mean: Float[Tensor, " d_in"], scale: float
) -> SparseAutoencoder:
    """A copy of the SAE in training, folded into the model's units (for a checkpoint)."""
    folded = copy.deepcopy(sae)
    _fold(folded, mean, scale)
    return folded


def _check_arguments(store, name, d_sae, steps, l1, k, l0, batch_size) -> None:
    given = {key: value for key, value in (("l1", l1), ("k", k), ("l0", l0)) if value is not None}
    if len(given) != 1:
        raise ValueError(
            f"give one of l1 (a ReLU SAE with an L1 penalty), k (a TopK SAE) or l0 (a JumpReLU "
            f"SAE with an L0 penalty), got {given or 'none'}"
        )
    for field, value in (("l1", l1), ("l0", l0)):
        if value is not None and not value >= 0:
            raise ValueError(f"{field} must be a non-negative number, got {value!r}")
    for field, value in (("steps", steps), ("batch_size", batch_size), ("d_sae", d_sae)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{field} must be a positive int, got {value!r}")
    shape = store.row_shape(name)
    if len(shape) != 1:
        raise ValueError(
            f"an SAE reads vectors; the rows of {name} have shape {shape}: store a point "
            f"whose rows are [d_in] (a residual stream, an MLP's neurons)"
        )


def _check_extras(lr, bandwidth, threshold, checkpoint_dir, **counts) -> None:
    """The rates and widths are positive finite numbers; `counts` (every how many steps
    something happens) positive ints, or None where the feature is optional."""
    if (counts["checkpoint_every"] is None) != (checkpoint_dir is None):
        raise ValueError("checkpoints need both checkpoint_every and checkpoint_dir")
    for field, value in (("lr", lr), ("bandwidth", bandwidth), ("threshold", threshold)):
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not (number and math.isfinite(value) and value > 0):
            raise ValueError(f"{field} must be a positive number, got {value!r} (finite)")
    for field, value in counts.items():
        optional = field in ("resample_every", "checkpoint_every")
        if optional and value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            kind = "a positive int or None" if optional else "a positive int"
            raise ValueError(f"{field} must be {kind}, got {value!r}")


@torch.no_grad()
def _constrain(sae: SparseAutoencoder) -> None:
    """Unit decoder rows, and non-negative thresholds (a JumpReLU's; other activations have
    no parameters): below zero a threshold would pass negative pre-activations, which the
    SAE's own `relu(pre) · (pre > θ)` does not."""
    sae.W_dec.div_(sae.W_dec.norm(dim=-1, keepdim=True).clamp(min=1e-12))
    for parameter in sae.activation.parameters():
        parameter.clamp_(min=0)


@torch.no_grad()
def _measure(
    step: int,
    batch_size: int,
    loss: Tensor,
    acts: Float[Tensor, "batch d_sae"],
    x: Float[Tensor, "batch d_in"],
    recons: Float[Tensor, "batch d_in"],
    since_fired: Tensor,
    dead_window: int,
) -> TrainingStep:
    """The numbers logged after step `step` (its tokens counted from the start)."""
    l0 = float((acts > 0).sum(-1).float().mean())
    tokens = (step + 1) * batch_size
    return TrainingStep(step, tokens, float(loss), l0, fraction_of_variance_explained(x, recons),
                        int((since_fired >= dead_window).sum()))  # fmt: skip


def fraction_of_variance_explained(
    x: Float[Tensor, "row d_in"], recons: Float[Tensor, "row d_in"]
) -> float:
    """`1 - |x - recons|^2 / |x - mean(x)|^2`, summed over rows and features."""
    residual = (x - recons).pow(2).sum()
    total = (x - x.mean(0)).pow(2).sum()
    return float(1 - residual / total)


@torch.no_grad()
def _fold(sae: SparseAutoencoder, mean: Float[Tensor, " d_in"], scale: float) -> None:
    """Make the SAE read `x` where it was trained on `(x - mean) / scale`.

    With `a' = scale · a` for the activations: `W_enc`, `W_dec` (unit rows) are kept,
    `b_enc` scales and `b_dec` becomes `mean + scale · b_dec`; ReLU and TopK commute with
    a positive scale, and so does a JumpReLU once its thresholds (its only parameters)
    scale too, so the reconstruction is `scale · recons + mean`, as it must be.
    """
    sae.b_enc.mul_(scale)
    for parameter in sae.activation.parameters():
        parameter.mul_(scale)
    sae.b_dec.mul_(scale).add_(mean.to(sae.b_dec.dtype))
