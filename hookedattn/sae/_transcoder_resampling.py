"""Dead-feature resampling for transcoders: the SAEs' rule (`hookedattn.sae._resampling`,
after Bricken et al. 2023) with the encoder and the decoder in different spaces.

For each dead feature of a layer, a row of the batch is drawn with probability
proportional to the square of its loss (summed over the layers the feature writes to), so
the features go where the transcoder is worst. With `v` that row's input and `r` its
residuals `y - recons` (over the layers written to), each normalised to unit length:

    decoder_f = r                 (a unit decoder, like every other)
    W_enc[:, f] = v · s · mean |W_enc[:, g]| over the live features g
    b_enc[f] = 0

so the feature fires on the row it was drawn for and writes what was missing there; `s`
is the SAEs' `ENCODER_SCALE` (0.2, or 1 for TopK). Adam's moments of those entries are
zeroed, and the draw comes from a generator seeded by the training seed and the step.
"""

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from hookedattn.sae._resampling import ENCODER_SCALE
from hookedattn.sae.transcoder_set import TranscoderSet

Rows = Float[Tensor, "batch d"]


@torch.no_grad()
def resample_dead(
    tset: TranscoderSet,
    layer: int,
    optimizer: torch.optim.Optimizer,
    x: Float[Tensor, "batch d_in"],
    residuals: dict[int, Rows],
    dead: Bool[Tensor, " d_sae"],
    seed: int,
    activation: str,
) -> Bool[Tensor, " d_sae"]:
    """Point layer `layer`'s `dead` features at high-loss rows (module docstring);
    `residuals[L]` is `y_L - recons_L` for each layer the features write to. Returns which
    features were resampled (all the dead ones, or as many as the batch has rows)."""
    dead_index = dead.nonzero().flatten()
    n = min(len(dead_index), x.shape[0])
    resampled = torch.zeros_like(dead)
    if n == 0:
        return resampled
    dead_index = dead_index[:n]
    outputs = tset.outputs(layer)
    r = torch.stack([residuals[o] for o in outputs], dim=1)  # batch layer_out d_out
    loss = r.pow(2).flatten(1).sum(-1)
    generator = torch.Generator().manual_seed(seed)
    rows = torch.multinomial(loss.pow(2) + 1e-30, n, replacement=False, generator=generator)
    v = x[rows] / x[rows].norm(dim=-1, keepdim=True).clamp(min=1e-12)
    r = r[rows] / r[rows].flatten(1).norm(dim=-1)[:, None, None].clamp(min=1e-12)
    W_enc, b_enc = tset.encoder(layer)
    decoders = tset.feature_decoders(layer)
    alive = ~dead
    norm = W_enc[:, alive].norm(dim=0).mean() if bool(alive.any()) else 1.0
    decoders[dead_index] = r.reshape(n, *decoders.shape[1:])
    W_enc[:, dead_index] = v.T * (ENCODER_SCALE[activation] * norm)
    b_enc[dead_index] = 0
    resampled[dead_index] = True
    _reset_moments(optimizer, tset, layer, dead_index)
    return resampled


def _reset_moments(
    optimizer: torch.optim.Optimizer, tset: TranscoderSet, layer: int, index: Tensor
):
    """Zero Adam's running moments of the resampled features' weights (the parameters are
    whole tensors; for a cross-layer transcoder the layer's slice of them)."""
    prefix = (layer,) if tset.kind == "cross_layer" else ()
    module = tset.source if tset.kind == "cross_layer" else tset.modules[tset.layers.index(layer)]
    decoders = tset.feature_decoders(layer)
    for parameter, select in ((module.W_enc, (*prefix, slice(None), index)),
                              (module.b_enc, (*prefix, index)),
                              (decoders, (index,))):  # fmt: skip
        state = optimizer.state.get(parameter, {})
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                state[key][select] = 0
