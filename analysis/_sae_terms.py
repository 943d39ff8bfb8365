"""The stream at a spliced SAE's residual point as its features, decoder bias and error.

With an SAE spliced at a residual-stream point (`model.saes([sae])`), the stream that
leaves that point is

    out = Σ_f acts_f · W_dec[f]  +  b_dec  +  (out - recons)

where the last term is what the splice adds beyond the reconstruction: the error term
`x - recons` with `use_error_term=True` (so `out` is the model's own stream, to rounding),
zero without it. `feature_terms` returns those terms, one per feature active anywhere in
the batch (`F12`), `sae_b_dec` and `sae_error`. `decompose_resid(granularity="features")`
and `analysis.features` are built on it.
"""

import torch
from jaxtyping import Float
from torch import Tensor

from analysis._reading import activation, weight
from hookedattn.core.cache import ActivationCache
from hookedattn.core.model import HookedTransformer
from hookedattn.core.names import get_act_name
from hookedattn.sae import SparseAutoencoder, sae_hook_name

_SITES = ("resid_pre", "resid_mid", "resid_post")


def feature_label(feature: int) -> str:
    """The label of feature `feature`'s term: `F12`."""
    return f"F{feature}"


def sae_point(model: HookedTransformer, sae: SparseAutoencoder) -> tuple[str, int]:
    """`(site, layer)` of the residual point the SAE reads."""
    if not isinstance(sae, SparseAutoencoder):
        raise TypeError(f"sae must be a SparseAutoencoder, got {type(sae).__name__}")
    for layer in range(model.cfg.n_layers):
        for site in _SITES:
            if get_act_name(site, layer) == sae.cfg.hook_name:
                return site, layer
    raise ValueError(
        f"feature decompositions are of the residual stream; this SAE reads "
        f"{sae.cfg.hook_name!r}, not a resid_pre, resid_mid or resid_post point"
    )


def _sae_entry(cache: ActivationCache, sae: SparseAutoencoder, hook: str) -> Tensor:
    name = sae_hook_name(sae.cfg.hook_name, hook)
    if name not in cache:
        raise KeyError(
            f"the cache has no {name}: record it with the SAE spliced "
            f"(with model.saes([sae]): model.run_with_cache(...))"
        )
    return activation(cache, name)


def feature_terms(
    cache: ActivationCache, sae: SparseAutoencoder
) -> tuple[tuple[str, ...], Float[Tensor, "component batch pos d_model"]]:
    """The labels and terms of the stream at the SAE's point (module docstring): each
    active feature's `acts_f · W_dec[f]`, then `sae_b_dec`, then `sae_error`."""
    acts = _sae_entry(cache, sae, "hook_acts")
    active = (acts != 0).flatten(0, -2).any(0).nonzero().flatten()
    W_dec = weight(sae.W_dec, acts)[active]
    features = acts[..., active].movedim(-1, 0)[..., None] * W_dec[:, None, None, :]
    out, recons = _sae_entry(cache, sae, "hook_out"), _sae_entry(cache, sae, "hook_recons")
    bias = torch.broadcast_to(weight(sae.b_dec, acts), out.shape)
    components = torch.cat([features, bias[None], (out - recons)[None]])
    labels = (*(feature_label(int(f)) for f in active), "sae_b_dec", "sae_error")
    return labels, components
