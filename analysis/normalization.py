"""Passing a decomposed residual stream through the norm that reads it, exactly.

A norm is linear once its scale is fixed: LayerNorm computes
`w * (x - mean(x)) / scale + b`, RMSNorm `w * x / scale`. With the scale the forward
recorded at `hook_scale`, each component `c` maps to `w * (c - mean(c)) / scale` (no
centring for RMS), and those images plus the norm's bias, kept as its own labelled
component (`ln_final_bias`, `L2_ln1_bias`), add up to the norm's output `hook_normalized`
exactly. TransformerLens's `apply_ln_to_stack` divides by the scale but leaves out `w` and
`b` (it assumes they were folded into the next weights), so its components sum to the
normalised stream only for folded models; ours sum to it for every model.

`normalize` applies a norm from scratch, its scale recomputed from the stream it is given:
what the logit lens needs (see `analysis.logit_lens`).
"""

import dataclasses
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor, nn

from analysis._reading import activation, weight
from analysis.resid_stack import Decomposition, ResidStack, check_sums_to
from hookedattn.cache import ActivationCache
from hookedattn.model import HookedTransformer
from hookedattn.names import get_act_name

NormWhich = Literal["ln1", "ln2", "ln_final"]


@dataclasses.dataclass(frozen=True)
class NormSite:
    """One norm module of a model: `ln1`/`ln2` of a block, or `ln_final` (layer None)."""

    which: NormWhich
    layer: int | None = None

    @property
    def name(self) -> str:
        """The module path, e.g. `blocks.2.ln1` or `ln_final`."""
        return "ln_final" if self.layer is None else f"blocks.{self.layer}.{self.which}"

    @property
    def label(self) -> str:
        """The prefix of its labels, e.g. `L2_ln1` or `ln_final`."""
        return "ln_final" if self.layer is None else f"L{self.layer}_{self.which}"

    def hook(self, what: Literal["scale", "normalized"]) -> str:
        """The full name of its `hook_scale` or `hook_normalized`."""
        if self.layer is None:
            return get_act_name(what)
        return get_act_name(what, self.layer, self.which)

    def module(self, model: HookedTransformer) -> nn.Module:
        """The norm module itself (an `nn.Identity` when the model has no norms)."""
        if self.layer is None:
            return model.ln_final
        return getattr(model.blocks[self.layer], self.which)


def reading_norm(model: HookedTransformer, site: str, layer: int) -> NormSite:
    """The norm that reads the residual stream at `(site, layer)`.

    `resid_pre` of block L is read by its `ln1`, `resid_mid` by its `ln2`, `resid_post`
    by the next block's `ln1`, or by `ln_final` after the last block.
    """
    n_layers = model.cfg.n_layers
    if site == "resid_pre":
        return NormSite("ln1", layer)
    if site == "resid_mid":
        return NormSite("ln2", layer)
    if site == "resid_post":
        return NormSite("ln_final") if layer == n_layers - 1 else NormSite("ln1", layer + 1)
    raise ValueError(f"site must be 'resid_pre', 'resid_mid' or 'resid_post', got {site!r}")


def normalize(
    model: HookedTransformer, norm: NormSite, x: Float[Tensor, "*stack batch pos d_model"]
) -> Float[Tensor, "*stack batch pos d_model"]:
    """Apply the norm to each stream in `x`, computing each stream's own scale.

    The same operations, in the same order, as `hookedattn.components.norm`, without
    running its hook points (so no attached hook fires).
    """
    kind = model.cfg.normalization_type
    if kind is None:
        return x
    module = norm.module(model)
    if kind in ("LN", "LNPre"):
        x = x - x.mean(-1, keepdim=True)
    scale = (x.pow(2).mean(-1, keepdim=True) + module.eps).sqrt()
    x = x / scale
    if kind in ("LN", "RMS"):
        x = x * weight(module.w, x)
    if kind == "LN":
        x = x + weight(module.b, x)
    return x


def apply_ln_to_stack(
    model: HookedTransformer,
    cache: ActivationCache,
    decomposition: ResidStack,
    *,
    check: bool = False,
) -> Decomposition:
    """The decomposition passed through the norm that reads its stream, summing exactly.

    Each component is centred (LayerNorm only: RMSNorm does not centre), divided by the
    scale cached at that norm's `hook_scale`, and multiplied by the norm's gain `w`; the
    norm's bias `b` becomes one more component, labelled `<norm>_bias` (`ln_final_bias`,
    `L2_ln1_bias`). The result sums to the norm's output `hook_normalized`: with
    `check=True` that is verified against the cache and a `DecompositionError` names the
    largest error. A model without norms returns the components unchanged. Blocks with
    per-head inputs (`use_split_qkv_input`, `use_attn_in`) record one scale per head, all
    equal unless patched; head 0's is used.
    """
    if not isinstance(decomposition, Decomposition):
        raise TypeError(
            f"apply_ln_to_stack takes a Decomposition (components of one stream), got "
            f"{type(decomposition).__name__}; to normalise each entry of an "
            f"AccumulatedResid with its own scale, use logit_lens or normalize"
        )
    if decomposition.normalized_by is not None:
        raise ValueError(
            f"this decomposition has already been passed through {decomposition.normalized_by}"
        )
    norm = reading_norm(model, decomposition.site, decomposition.layer)
    kind = model.cfg.normalization_type
    components, labels = decomposition.components, decomposition.labels
    if kind is not None:
        scale = _cached_scale(cache, norm)
        if kind in ("LN", "LNPre"):
            components = components - components.mean(-1, keepdim=True)
        components = components / scale
        module = norm.module(model)
        if kind in ("LN", "RMS"):
            components = components * weight(module.w, components)
        if kind == "LN":
            bias = torch.broadcast_to(weight(module.b, components), components.shape[1:])
            components = torch.cat([components, bias[None]])
            labels = (*labels, f"{norm.label}_bias")
        if check:
            target = _per_head_first(activation(cache, norm.hook("normalized")))
            what = f"{decomposition.hook_name} through {norm.name}"
            check_sums_to(components, target, what, model.cfg.dtype)
    return Decomposition(components, labels, decomposition.site, decomposition.layer, norm.name)


def _cached_scale(cache: ActivationCache, norm: NormSite) -> Float[Tensor, "batch pos 1"]:
    return _per_head_first(activation(cache, norm.hook("scale")))


def _per_head_first(t: Tensor) -> Tensor:
    # Per-head inputs give the norm a head axis before d_model: [batch pos head d].
    return t[:, :, 0] if t.ndim == 4 else t
