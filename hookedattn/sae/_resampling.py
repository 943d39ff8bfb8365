"""Dead-feature resampling (Bricken et al. 2023, "Towards Monosemanticity", "Neuron
resampling"): a feature that has stopped firing is pointed at an input the SAE
reconstructs badly.

At each resampling step, for every dead feature (silent for `dead_window` steps), a row of
the current batch is drawn with probability proportional to the square of its
reconstruction loss, so the features go where the dictionary is worst. With `v` that
row as the encoder reads it (after the pre-bias), normalised to unit length:

    W_dec[f] = v                       (a unit decoder row, like every other)
    W_enc[:, f] = v · s · mean |W_enc[:, g]| over the live features g
    b_enc[f] = 0

so the feature fires on the row it was drawn for, and writes along it. `s` is 0.2 for a
ReLU (or JumpReLU) SAE, as Bricken et al.: small, so the feature grows into its place
without disturbing the others. A TopK SAE takes 1: there a feature fires only among the
`k` largest pre-activations, and at 0.2 of the live features' norm it would never be,
staying dead (measured: no fewer dead than without resampling). A JumpReLU feature keeps
its threshold. Adam's moments for those entries are zeroed: the old ones belong to a
dead feature. The draw comes from a generator seeded by the training seed and the step,
so a run stays repeatable.
"""

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from hookedattn.sae.autoencoder import SparseAutoencoder

ENCODER_SCALE = {"relu": 0.2, "jumprelu": 0.2, "topk": 1.0}  # module docstring


@torch.no_grad()
def resample_dead(
    sae: SparseAutoencoder,
    optimizer: torch.optim.Optimizer,
    x: Float[Tensor, "batch d_in"],
    dead: Bool[Tensor, " d_sae"],
    seed: int,
) -> Bool[Tensor, " d_sae"]:
    """Point the `dead` features at high-loss rows of `x` (module docstring); returns
    which features were resampled (all the dead ones, or as many as `x` has rows)."""
    dead_index = dead.nonzero().flatten()
    n = min(len(dead_index), x.shape[0])
    resampled = torch.zeros_like(dead)
    if n == 0:
        return resampled
    dead_index = dead_index[:n]
    loss = (sae.decode(sae.encode(x)) - x).pow(2).sum(-1)
    generator = torch.Generator().manual_seed(seed)
    rows = torch.multinomial(loss.pow(2) + 1e-30, n, replacement=False, generator=generator)
    v = sae.pre_bias(x[rows], sae.b_dec)
    v = v / v.norm(dim=-1, keepdim=True).clamp(min=1e-12)
    alive = ~dead
    norm = sae.W_enc[:, alive].norm(dim=0).mean() if bool(alive.any()) else 1.0
    sae.W_dec[dead_index] = v
    sae.W_enc[:, dead_index] = v.T * (ENCODER_SCALE[sae.cfg.activation] * norm)
    sae.b_enc[dead_index] = 0
    resampled[dead_index] = True
    _reset_moments(optimizer, sae, dead_index)
    return resampled


def _reset_moments(optimizer: torch.optim.Optimizer, sae: SparseAutoencoder, index: Tensor) -> None:
    """Zero Adam's running moments of the resampled features' weights."""
    for parameter, select in ((sae.W_dec, (index,)), (sae.W_enc, (slice(None), index)),
                              (sae.b_enc, (index,))):  # fmt: skip
        state = optimizer.state.get(parameter, {})
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                state[key][select] = 0
