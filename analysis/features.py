"""The residual stream at a spliced SAE's point as a sum of its features, exactly.

With an SAE spliced at a residual-stream point (`model.saes([sae])`), the stream that
leaves that point is

    out = Σ_f acts_f · W_dec[f]  +  b_dec  +  (out - recons)

where the last term is what the splice adds beyond the reconstruction: the error term
`x - recons` with `use_error_term=True` (so `out` is the model's own stream, to rounding),
zero without it. `feature_decomposition` returns those terms, one per feature active
anywhere in the batch (`F12`), `sae_b_dec` and `sae_error`, as a `Decomposition` of the
point; they add up to the cached stream there. `feature_logit_attribution` extends them
with what the later sublayers write (the terms that make up the final stream after the
point) and attributes the logits through the final norm at its recorded scale: the
features', bias's and error's direct effects, which with the later terms, `ln_final_bias`
and `b_U` add up to the logits.
"""

import torch
from jaxtyping import Int
from torch import Tensor

from analysis._reading import activation, weight
from analysis.attribution import LogitAttribution, direct_logit_attribution
from analysis.decomposition import decompose_resid
from analysis.resid_stack import Decomposition, check_sums_to
from hookedattn.cache import ActivationCache
from hookedattn.model import HookedTransformer
from hookedattn.names import get_act_name
from hookedattn.sae import SparseAutoencoder, sae_hook_name

_SITES = ("resid_pre", "resid_mid", "resid_post")


def feature_label(feature: int) -> str:
    """The label of feature `feature`'s term: `F12`."""
    return f"F{feature}"


def _point(model: HookedTransformer, sae: SparseAutoencoder) -> tuple[str, int]:
    """`(site, layer)` of the residual point the SAE reads."""
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
    site, layer = _point(model, sae)
    acts = _sae_entry(cache, sae, "hook_acts")
    active = (acts != 0).flatten(0, -2).any(0).nonzero().flatten()
    W_dec = weight(sae.W_dec, acts)[active]
    features = acts[..., active].movedim(-1, 0)[..., None] * W_dec[:, None, None, :]
    out, recons = _sae_entry(cache, sae, "hook_out"), _sae_entry(cache, sae, "hook_recons")
    bias = torch.broadcast_to(weight(sae.b_dec, acts), out.shape)
    components = torch.cat([features, bias[None], (out - recons)[None]])
    labels = (*(feature_label(int(f)) for f in active), "sae_b_dec", "sae_error")
    if check:
        what = f"the feature decomposition of {sae.cfg.hook_name}"
        check_sums_to(components, activation(cache, sae.cfg.hook_name), what, model.cfg.dtype)
    return Decomposition(components, labels, site, layer)


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
