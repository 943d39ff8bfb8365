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
Σ_f acts_f |W_dec[f]|`; a TopK SAE has no penalty. After each Adam step the decoder rows
are renormalised to unit norm. A feature is dead when it has not fired in the last
`dead_window` steps. Everything random (initial weights, batch order) comes from `seed`,
so a run is repeatable.
"""

import copy
import dataclasses
import functools
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor
from tqdm.auto import tqdm

from hookedattn.sae.autoencoder import SparseAutoencoder
from hookedattn.sae.config import SAEConfig


@dataclasses.dataclass(frozen=True)
class TrainingStep:
    """What one logged step measured, on its own batch of normalised rows."""

    step: int
    tokens: int
    loss: float
    l0: float
    fve: float
    dead: int


def train_sae(
    store: Any,
    name: str,
    *,
    d_sae: int,
    steps: int,
    l1: float | None = None,
    k: int | None = None,
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

    A ReLU SAE with `l1` (its penalty), or a TopK SAE with `k`. Batches of `batch_size`
    rows are drawn shuffled, epoch after epoch. A `tqdm` bar shows loss, L0, fraction of
    variance explained and dead features every `log_every` steps; pass a list as `log` to
    receive those as `TrainingStep`s. With `checkpoint_every=n`, the SAE as it is after
    every n steps is saved (in the model's units, loadable by `SparseAutoencoder.load`)
    to `checkpoint_dir/step-000n`. Returns the SAE in float32, in the model's units.
    """
    _check_arguments(store, name, d_sae, steps, l1, k, batch_size)
    if (checkpoint_every is None) != (checkpoint_dir is None):
        raise ValueError("checkpoints need both checkpoint_every and checkpoint_dir")
    (d_in,) = store.row_shape(name)
    stats = store.stats(name)
    mean, scale = stats.mean.float(), float(stats.var.mean().sqrt())
    activation = "topk" if k is not None else "relu"
    sae = SparseAutoencoder(SAEConfig(d_in, d_sae, name, activation, k=k, seed=seed))
    optimizer = torch.optim.Adam(sae.parameters(), lr=lr)
    penalty = _no_penalty if l1 is None else functools.partial(_l1_penalty, l1)
    since_fired = torch.zeros(d_sae, dtype=torch.long)
    bar = tqdm(total=steps, disable=not progress, desc=f"SAE {name}", unit="step")
    for step, batch in enumerate(_batches(store, name, batch_size, seed, steps)):
        x = (batch.float() - mean) / scale
        loss, acts, recons = _step(sae, optimizer, x, penalty)
        # Activations are never negative, so a column's max says whether it fired; this
        # is a tenth of the cost of (acts > 0).any(0), which would be a tenth of a step.
        since_fired = torch.where(acts.amax(0) > 0, 0, since_fired + 1)
        if step % log_every == 0 or step == steps - 1:
            tokens = (step + 1) * batch_size
            record = _measure(step, tokens, loss, acts, x, recons, since_fired, dead_window)
            bar.set_postfix(loss=f"{record.loss:.3g}", L0=f"{record.l0:.1f}",
                            FVE=f"{record.fve:.3f}", dead=record.dead)  # fmt: skip
            if log is not None:
                log.append(record)
        if checkpoint_every is not None and (step + 1) % checkpoint_every == 0:
            _folded(sae, mean, scale).save(Path(checkpoint_dir) / f"step-{step + 1:06d}")
        bar.update()
    bar.close()
    _fold(sae, mean, scale)
    return sae


def _step(
    sae: SparseAutoencoder,
    optimizer: torch.optim.Optimizer,
    x: Float[Tensor, "batch d_in"],
    penalty: Callable[[SparseAutoencoder, Tensor], Tensor],
) -> tuple[Tensor, Float[Tensor, "batch d_sae"], Float[Tensor, "batch d_in"]]:
    """One Adam step on `x`; the loss, activations and reconstruction, detached."""
    acts = sae.encode(x)
    recons = sae.decode(acts)
    loss = (recons - x).pow(2).sum(-1).mean() + penalty(sae, acts)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    _unit_decoder_rows(sae)
    return loss.detach(), acts.detach(), recons.detach()


def _l1_penalty(l1: float, sae: SparseAutoencoder, acts: Float[Tensor, "batch d_sae"]) -> Tensor:
    """`l1 · Σ_f acts_f |W_dec[f]|`, averaged over rows."""
    return l1 * (acts * sae.W_dec.norm(dim=-1)).sum(-1).mean()


def _no_penalty(sae: SparseAutoencoder, acts: Float[Tensor, "batch d_sae"]) -> Tensor:
    """TopK sets the sparsity itself: no penalty."""
    return acts.new_zeros(())


def _folded(
    sae: SparseAutoencoder, mean: Float[Tensor, " d_in"], scale: float
) -> SparseAutoencoder:
    """A copy of the SAE in training, folded into the model's units (for a checkpoint)."""
    folded = copy.deepcopy(sae)
    _fold(folded, mean, scale)
    return folded


def _check_arguments(store, name, d_sae, steps, l1, k, batch_size) -> None:
    if (l1 is None) == (k is None):
        raise ValueError(
            f"give either l1 (a ReLU SAE with an L1 penalty) or k (a TopK SAE), got l1={l1!r}, "
            f"k={k!r}"
        )
    if l1 is not None and not l1 >= 0:
        raise ValueError(f"l1 must be a non-negative number, got {l1!r}")
    for field, value in (("steps", steps), ("batch_size", batch_size), ("d_sae", d_sae)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{field} must be a positive int, got {value!r}")
    shape = store.row_shape(name)
    if len(shape) != 1:
        raise ValueError(
            f"an SAE reads vectors; the rows of {name} have shape {shape}: store a point "
            f"whose rows are [d_in] (a residual stream, an MLP's neurons)"
        )


def _batches(store: Any, name: str, batch_size: int, seed: int, steps: int) -> Iterator[Tensor]:
    """`steps` full batches, epoch after epoch, each epoch in its own shuffled order."""
    if len(store) < batch_size:
        raise ValueError(
            f"the store holds {len(store)} rows of {name}, fewer than one batch of {batch_size}"
        )
    step, epoch = 0, 0
    while True:
        for batch in store.batches(
            name, batch_size, shuffle=True, seed=seed + epoch, drop_last=True
        ):
            if not bool(torch.isfinite(batch).all()):
                raise ValueError(
                    f"batch {step} (epoch {epoch}) of {name} in the store {store.path} holds NaN "
                    f"or infinite values: the model produced them there, or the store is damaged"
                )
            yield batch
            step += 1
            if step == steps:
                return
        epoch += 1


@torch.no_grad()
def _unit_decoder_rows(sae: SparseAutoencoder) -> None:
    sae.W_dec.div_(sae.W_dec.norm(dim=-1, keepdim=True).clamp(min=1e-12))


@torch.no_grad()
def _measure(
    step: int,
    tokens: int,
    loss: Tensor,
    acts: Float[Tensor, "batch d_sae"],
    x: Float[Tensor, "batch d_in"],
    recons: Float[Tensor, "batch d_in"],
    since_fired: Tensor,
    dead_window: int,
) -> TrainingStep:
    l0 = float((acts > 0).sum(-1).float().mean())
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
    a positive scale, so the reconstruction is `scale · recons + mean`, as it must be.
    """
    sae.b_enc.mul_(scale)
    sae.b_dec.mul_(scale).add_(mean.to(sae.b_dec.dtype))
