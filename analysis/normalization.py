"""Passing a decomposed residual stream through the norm that reads it, exactly.

A norm is linear once its scale is fixed: LayerNorm computes
`w * (x - mean(x)) / scale + b`, RMSNorm `w * x / scale`. With the scale the forward
recorded at `hook_scale`, each component `c` maps to `w * (c - mean(c)) / scale` (no
centring for RMS), and those images plus the norm's bias, kept as its own labelled
component (`ln_final_bias`, `L2_ln1_bias`), add up to the norm's output `hook_out`
exactly. TransformerLens's `apply_ln_to_stack` divides by the scale but leaves out `w` and
`b` (it assumes they were folded into the next weights), so its components sum to the
norm's output only for folded models (for others they sum to `hook_normalized`, the stream
before the gain); ours sum to the output for every model.

`normalize` applies a norm from scratch, its scale recomputed from the stream it is given:
what the logit lens needs (see `analysis.logit_lens`).

The same frozen-scale map passes the terms of a sublayer's output through the norm after
that sublayer (`ln1_post`, `ln2_post`: Gemma 2, OLMo 2), which is part of what the sublayer
writes (`through_norm`): the terms then sum exactly to `hook_attn_out` or `hook_mlp_out`,
each term divided by the scale all of them produced together. Where a block has no norm at
a place (`normalization_placement="post"` has no `ln1`), that norm is the identity.
"""

import dataclasses
from collections.abc import Sequence
from typing import Literal

import torch
from jaxtyping import Float
from torch import Tensor, nn

from analysis._reading import activation, weight
from analysis._resid_stack import Decomposition, ResidStack, Stack, check_sums_to
from hookedattn.core.cache import ActivationCache
from hookedattn.core.components.norm import LayerNormPre, NoNorm
from hookedattn.core.model import HookedTransformer

NormWhich = Literal[
    "ln1", "ln2", "ln1_post", "ln2_post", "ln_resid_mid", "ln_resid_post", "ln_final", "ln_embed"
]


@dataclasses.dataclass(frozen=True)
class NormSite:
    """One norm module of a model: `ln1`/`ln2` (before a block's sublayers), `ln1_post`/
    `ln2_post` (after them), `ln_resid_mid`/`ln_resid_post` (after its adds) of a block, or
    `ln_final` or `ln_embed` (layer None)."""

    which: NormWhich
    layer: int | None = None

    @property
    def name(self) -> str:
        """The module path, e.g. `blocks.2.ln1` or `ln_final`."""
        return self.which if self.layer is None else f"blocks.{self.layer}.{self.which}"

    @property
    def label(self) -> str:
        """The prefix of its labels, e.g. `L2_ln1` or `ln_final`."""
        return self.which if self.layer is None else f"L{self.layer}_{self.which}"

    def hook(self, what: Literal["scale", "normalized", "out"]) -> str:
        """The full name of its `hook_scale`, `hook_normalized` (before the gain) or
        `hook_out` (after the gain and bias)."""
        return f"{self.name}.hook_{what}"

    def module(self, model: HookedTransformer) -> nn.Module:
        """The norm module itself (a `NoNorm`, the identity, where the model has none there)."""
        if self.layer is None:
            return getattr(model, self.which)
        return getattr(model.blocks[self.layer], self.which)


def reading_norm(
    model: HookedTransformer, site: str, layer: int, which: str | None = None
) -> NormSite:
    """The norm that reads the residual stream at `(site, layer)`.

    `resid_pre` of block L is read by its `ln1`, `resid_mid` by its `ln2`, `resid_post`
    by the next block's `ln1`, or by `ln_final` after the last block. In a parallel block
    (`parallel_attn_mlp`) both norms read `resid_pre`: `which="ln2"` picks the MLP's.
    """
    n_layers = model.cfg.n_layers
    if which is not None:
        if not (site == "resid_pre" and which == "ln2" and model.cfg.parallel_attn_mlp):
            raise ValueError(
                f"which={which!r} chooses between the two norms that read resid_pre of a "
                f"parallel block ('ln2', the MLP's; 'ln1' is the default); the stream at "
                f"{site} of layer {layer} has one reader here"
            )
        return NormSite("ln2", layer)
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

    The same operations, in the same order, as `hookedattn.core.components.norm`, without
    running its hook points (so no attached hook fires).
    """
    return normalize_by(norm.module(model), x)


def normalize_by(
    module: nn.Module, x: Float[Tensor, "*stack batch pos d_model"]
) -> Float[Tensor, "*stack batch pos d_model"]:
    """`normalize` by a norm module itself (one outside the blocks' and the final norm's
    places: the head transform's `ln_unembed`)."""
    if isinstance(module, NoNorm):
        return x
    if isinstance(module, LayerNormPre):
        x = x - x.mean(-1, keepdim=True)
    scale = (x.pow(2).mean(-1, keepdim=True) + module.eps).sqrt()
    x = x / scale
    if hasattr(module, "w"):
        x = x * weight(module.w, x)
    if hasattr(module, "b"):
        x = x + weight(module.b, x)
    return x


def through_norm(
    model: HookedTransformer,
    cache: ActivationCache,
    norm: NormSite,
    components: Stack,
    labels: tuple[str, ...],
    *,
    positions: Sequence[int] | None = None,
) -> tuple[Float[Tensor, "term batch pos d_model"], tuple[str, ...]]:
    """Terms of a norm's input through that norm, at the scale its forward recorded.

    Each term is centred (LayerNorm), divided by the cached `hook_scale` and multiplied by
    the gain; the norm's bias is appended as one more term, labelled `<norm>_bias`. If the
    terms summed to the norm's input they now sum to its output, exactly. The identity
    (terms and labels unchanged) where the model has no norm there. `positions`: the
    components' `pos` axis holds these positions only (their cached scales are used).
    """
    module = norm.module(model)
    if isinstance(module, NoNorm):
        return components, labels
    if isinstance(module, LayerNormPre):
        components = components - components.mean(-1, keepdim=True)
    scale = _cached_scale(cache, norm)
    if positions is not None:
        scale = scale[:, list(positions)]
    components = components / scale
    if hasattr(module, "w"):
        components = components * weight(module.w, components)
    if hasattr(module, "b"):
        bias = torch.broadcast_to(weight(module.b, components), components.shape[1:])
        return torch.cat([components, bias[None]]), (*labels, f"{norm.label}_bias")
    return components, labels


def apply_ln_to_stack(
    model: HookedTransformer,
    cache: ActivationCache,
    decomposition: ResidStack,
    *,
    check: bool = False,
    which: str | None = None,
) -> Decomposition:
    """The decomposition passed through the norm that reads its stream, summing exactly.

    Each component is centred (LayerNorm only: RMSNorm does not centre), divided by the
    scale cached at that norm's `hook_scale`, and multiplied by the norm's gain `w`; the
    norm's bias `b` becomes one more component, labelled `<norm>_bias` (`ln_final_bias`,
    `L2_ln1_bias`). The result sums to the norm's output `hook_out`: with
    `check=True` that is verified against the cache and a `DecompositionError` names the
    largest error. A model without norms returns the components unchanged. Blocks with
    per-head inputs (`use_split_qkv_input`, `use_attn_in`) record one scale per head, all
    equal unless patched; head 0's is used. Where no norm reads the stream (a block with
    norms after its sublayers only) the components are returned unchanged. `which="ln2"`:
    the MLP's norm of a parallel block, which reads `resid_pre` too (see `reading_norm`).
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
    norm = reading_norm(model, decomposition.site, decomposition.layer, which)
    components, labels = through_norm(
        model, cache, norm, decomposition.components, decomposition.labels
    )
    if check and not isinstance(norm.module(model), NoNorm):
        target = _per_head_first(activation(cache, norm.hook("out")))
        what = f"{decomposition.hook_name} through {norm.name}"
        check_sums_to(components, target, what, model.cfg.dtype)
    return Decomposition(components, labels, decomposition.site, decomposition.layer, norm.name)


def _cached_scale(cache: ActivationCache, norm: NormSite) -> Float[Tensor, "batch pos 1"]:
    return _per_head_first(activation(cache, norm.hook("scale")))


def _per_head_first(t: Tensor) -> Tensor:
    # Per-head inputs give the norm a head axis before d_model: [batch pos head d].
    return t[:, :, 0] if t.ndim == 4 else t
