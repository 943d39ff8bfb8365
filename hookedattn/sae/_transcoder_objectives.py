"""What a transcoder is trained to minimise besides its error: one small term per variant,
chosen before the loop, for one layer's features at a time.

- `L1Penalty` (ReLU): `l1 · Σ_f acts_f · |decoder_f|`, the decoder norm taken over every
  layer the feature writes to (for a cross-layer transcoder, Ameisen et al. 2025).
- `L0Penalty` (JumpReLU): `l0 · Σ_f H(pre_f - θ_f)`, with the thresholds learnt through the
  SAEs' straight-through estimators (`hookedattn.sae._objectives.jumprelu_ste`, `step_ste`).
- TopK sets its sparsity itself: `no_penalty`.

Each takes the set, the layer, and that layer's pre-activations and activations `[batch
d_sae]`, and returns a scalar averaged over the batch. These mirror the SAEs' terms in
`hookedattn.sae._objectives`, which take an SAE; a shared form could serve both.
"""

import dataclasses

from jaxtyping import Float
from torch import Tensor

from hookedattn.sae._objectives import jumprelu_ste, step_ste
from hookedattn.sae.transcoder_set import TranscoderSet

Pre = Float[Tensor, "batch d_sae"]


def own_activation(tset: TranscoderSet, layer: int, pre: Pre) -> Pre:
    """The layer's own activation function (ReLU, TopK)."""
    return tset.activation(layer)(pre)


@dataclasses.dataclass(frozen=True)
class JumpReLUActivation:
    """The JumpReLU of the layer's thresholds, with their straight-through gradient."""

    bandwidth: float

    def __call__(self, tset: TranscoderSet, layer: int, pre: Pre) -> Pre:
        """`pre · H(pre - θ)`, differentiable in θ."""
        return jumprelu_ste(pre, tset.activation(layer).threshold, self.bandwidth)


def no_penalty(tset: TranscoderSet, layer: int, pre: Pre, acts: Pre) -> Tensor:
    """TopK sets the sparsity itself: no penalty."""
    return acts.new_zeros(())


@dataclasses.dataclass(frozen=True)
class L1Penalty:
    """`l1 · Σ_f acts_f |decoder_f|`, averaged over rows."""

    l1: float

    def __call__(self, tset: TranscoderSet, layer: int, pre: Pre, acts: Pre) -> Tensor:
        """The penalty on this batch."""
        return self.l1 * (acts * tset.decoder_norms(layer)).sum(-1).mean()


@dataclasses.dataclass(frozen=True)
class L0Penalty:
    """`l0 · Σ_f H(pre_f - θ_f)`, averaged over rows: `l0` times the batch's mean L0."""

    l0: float
    bandwidth: float

    def __call__(self, tset: TranscoderSet, layer: int, pre: Pre, acts: Pre) -> Tensor:
        """The penalty on this batch."""
        active = step_ste(pre, tset.activation(layer).threshold, self.bandwidth)
        return self.l0 * active.sum(-1).mean()
