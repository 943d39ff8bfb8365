"""What an SAE is trained to minimise, one small function per term, chosen before the loop.

    loss = |x - recons|^2 + penalty

- `L1Penalty` (ReLU SAEs): `l1 · Σ_f acts_f |W_dec[f]|`.
- `L0Penalty` (JumpReLU SAEs, Rajamanoharan et al. 2024, "Jumping Ahead"): `l0 · Σ_f
  H(pre_f - θ_f)`, the number of active features, with the threshold `θ` learnt through
  straight-through estimators (`jumprelu_ste`, `step_ste`): the Heaviside step `H` has
  derivative zero almost everywhere, so its derivative with respect to `θ` is replaced by
  a rectangle kernel of width `bandwidth` around the threshold (their eq. 11-12). The
  pre-activations get the ordinary gradient of `pre · H(pre - θ)`; the L0 term gives them
  none.

Penalties take the normalised batch's pre-activations and activations `[batch d_sae]` and
return a scalar averaged over the batch, like the reconstruction term.
"""

import dataclasses

import torch
from jaxtyping import Float
from torch import Tensor

from hookedattn.sae.autoencoder import SparseAutoencoder

Pre = Float[Tensor, "batch d_sae"]


def _kernel(pre: Pre, threshold: Float[Tensor, " d_sae"], bandwidth: float) -> Pre:
    """The rectangle kernel `K((pre - θ) / ε) / ε`: 1/ε within ε/2 of the threshold."""
    return ((pre - threshold).abs() < bandwidth / 2).to(pre.dtype) / bandwidth


class _JumpReLU(torch.autograd.Function):
    """`pre · H(pre - θ)`; d/dθ is `-(θ/ε) K((pre - θ)/ε)` (Rajamanoharan et al., eq. 11)."""

    @staticmethod
    def forward(ctx, pre: Tensor, threshold: Tensor, bandwidth: float) -> Tensor:
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return pre * (pre > threshold)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, None]:
        pre, threshold = ctx.saved_tensors
        d_pre = grad * (pre > threshold)
        d_threshold = -(threshold * _kernel(pre, threshold, ctx.bandwidth) * grad).sum(0)
        return d_pre, d_threshold, None


class _Step(torch.autograd.Function):
    """`H(pre - θ)`; d/dθ is `-(1/ε) K((pre - θ)/ε)`, d/dpre is zero (their eq. 12)."""

    @staticmethod
    def forward(ctx, pre: Tensor, threshold: Tensor, bandwidth: float) -> Tensor:
        ctx.save_for_backward(pre, threshold)
        ctx.bandwidth = bandwidth
        return (pre > threshold).to(pre.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[None, Tensor, None]:
        pre, threshold = ctx.saved_tensors
        return None, -(_kernel(pre, threshold, ctx.bandwidth) * grad).sum(0), None


def jumprelu_ste(pre: Pre, threshold: Float[Tensor, " d_sae"], bandwidth: float) -> Pre:
    """The JumpReLU activation, with a straight-through gradient for `threshold`.

    Forward it is the SAE's own JumpReLU for a non-negative threshold (`relu(pre) · (pre >
    θ)` equals `pre · (pre > θ)` when `θ >= 0`).
    """
    return _JumpReLU.apply(pre, threshold, bandwidth)


def step_ste(pre: Pre, threshold: Float[Tensor, " d_sae"], bandwidth: float) -> Pre:
    """`H(pre - θ)` (1 where a feature is active), with a straight-through gradient for θ."""
    return _Step.apply(pre, threshold, bandwidth)


def activate(sae: SparseAutoencoder, pre: Pre) -> Pre:
    """The SAE's own activation function (ReLU, TopK)."""
    return sae.activation(pre)


@dataclasses.dataclass(frozen=True)
class JumpReLUActivation:
    """The JumpReLU of the SAE's thresholds, with their straight-through gradient."""

    bandwidth: float

    def __call__(self, sae: SparseAutoencoder, pre: Pre) -> Pre:
        """`pre · H(pre - θ)`, differentiable in θ."""
        return jumprelu_ste(pre, sae.activation.threshold, self.bandwidth)


def no_penalty(sae: SparseAutoencoder, pre: Pre, acts: Pre) -> Tensor:
    """TopK sets the sparsity itself: no penalty."""
    return acts.new_zeros(())


@dataclasses.dataclass(frozen=True)
class L1Penalty:
    """`l1 · Σ_f acts_f |W_dec[f]|`, averaged over rows."""

    l1: float

    def __call__(self, sae: SparseAutoencoder, pre: Pre, acts: Pre) -> Tensor:
        """The penalty on this batch."""
        return self.l1 * (acts * sae.W_dec.norm(dim=-1)).sum(-1).mean()


@dataclasses.dataclass(frozen=True)
class L0Penalty:
    """`l0 · Σ_f H(pre_f - θ_f)`, averaged over rows: `l0` times the batch's mean L0."""

    l0: float
    bandwidth: float

    def __call__(self, sae: SparseAutoencoder, pre: Pre, acts: Pre) -> Tensor:
        """The penalty on this batch."""
        active = step_ste(pre, sae.activation.threshold, self.bandwidth)
        return self.l0 * active.sum(-1).mean()
