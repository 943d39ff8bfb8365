"""The residual stream at a spliced SAE's point as a sum of its features, exactly.

With an SAE spliced at a residual-stream point (`model.saes([sae])`), the stream that
leaves that point is

    out = Σ_f acts_f · W_dec[f]  +  b_dec  +  (out - recons)

where the last term is what the splice adds beyond the reconstruction: the error term
`x - recons` with `use_error_term=True` (so `out` is the model's own stream, to rounding),
zero without it. `feature_decomposition` returns those terms, one per feature active
anywhere in the batch (`F12`), `sae_b_dec` and `sae_error`, as a `Decomposition` of the
point: `decompose_resid(granularity="features", sae=sae)` there. `feature_logit_attribution`
extends them with what the later sublayers write (at any granularity, where
`decompose_resid`'s `"features"` has them as whole sublayers) and attributes the logits
through the final norm at its recorded scale: the features', bias's and error's direct
effects, which with the later terms, `ln_final_bias` and `b_U` add up to the logits.

More in `docs/guide/saes.md`.
"""

import torch
from jaxtyping import Int
from torch import Tensor

from analysis._resid_stack import Decomposition
from analysis._sae_terms import feature_label, sae_point
from analysis.decomposition import decompose_resid
from analysis.direct_logit_attribution import LogitAttribution, direct_logit_attribution
from hookedattn.core.cache import ActivationCache
from hookedattn.core.model import HookedTransformer
from hookedattn.sae import SparseAutoencoder

__all__ = ["feature_decomposition", "feature_label", "feature_logit_attribution"]


def feature_decomposition(
    model: HookedTransformer,
    cache: ActivationCache,
    sae: SparseAutoencoder,
    *,
    check: bool = False,
) -> Decomposition:
    """The stream at the SAE's point as its active features, `sae_b_dec` and `sae_error`.

    A feature's term is `acts_f · W_dec[f]` (`[batch pos d_model]`), for every feature
    active at some batch element and position (module docstring). With `check=True` the
    sum is compared with the cached stream there (a `DecompositionError` if beyond rounding).
    """
    site, layer = sae_point(model, sae)
    return decompose_resid(model, cache, layer, site, "features", check=check, sae=sae)


def feature_logit_attribution(
    model: HookedTransformer,
    cache: ActivationCache,
    sae: SparseAutoencoder,
    tokens: int | Int[Tensor, "*shape"],
    incorrect_tokens: int | Int[Tensor, "*shape"] | None = None,
    *,
    granularity: str = "sublayer",
) -> LogitAttribution:
    """Each active feature's direct contribution to the logit of `tokens`, exactly.

    The final stream is written as the SAE's terms at its point plus what every later
    sublayer wrote (at `granularity`, as in `decompose_resid`); all of it goes through
    the final norm at the scale the forward recorded, then `W_U`. With `ln_final_bias`
    and `b_U` the contributions sum to the logits (or the logit difference against
    `incorrect_tokens`), as `direct_logit_attribution`'s do.
    """
    at_point = feature_decomposition(model, cache, sae)
    site, layer = at_point.site, at_point.layer
    # The terms already in the stream at the point are those its own decomposition has.
    before = set(decompose_resid(model, cache, layer, site, granularity).labels)
    final = decompose_resid(model, cache, None, granularity=granularity)
    later = [i for i, label in enumerate(final.labels) if label not in before]
    components = torch.cat([at_point.components, final.components[later]])
    labels = (*at_point.labels, *(final.labels[i] for i in later))
    n_final = model.cfg.n_layers - 1
    stack = Decomposition(components, labels, "resid_post", n_final)
    return direct_logit_attribution(model, cache, stack, tokens, incorrect_tokens)
