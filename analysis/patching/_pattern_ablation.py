"""Pattern-preserving ablation (Olsson et al. 2022, "In-context Learning and Induction
Heads"): remove what some heads write while every head keeps attending where it did.

A plain ablation of a head changes the input of every later layer, and so their attention
patterns: the effect mixes "what this head wrote" with "where later heads looked
instead". Freezing every pattern to the clean run's isolates the first. With the patterns
frozen, an attention-only model is linear in the residual stream up to its norms; with
their scales frozen too (`freeze_norm_scales=True`, or no norms at all) it is linear
outright, so zeroing a head removes exactly every path through it: the clean logits minus
the head's result carried through each later head's OV circuit (with its clean pattern)
and the unembedding. MLPs, when present, are left to respond as they do.

`frozen_pattern_hooks` gives the hooks alone, for other ablations and patching
experiments to combine with their own.

More in `docs/guide/patching.md`.
"""

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from analysis._naming import Component, HeadSpec, is_head_pair, parse_head
from analysis.normalization import NormSite
from hookedattn.core.cache import ActivationCache
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.model import HookedTransformer
from hookedattn.core.names import get_act_name

Hook = tuple[str, Callable[..., Tensor | None]]


def norm_sites(model: HookedTransformer) -> list[NormSite]:
    """Every norm of `model` whose scale a frozen forward holds (none without norms)."""
    if model.cfg.normalization_type is None:
        return []
    per_block = ("ln1", "ln2") if model.cfg.has_mlp else ("ln1",)
    blocks = [NormSite(w, layer) for layer in range(model.cfg.n_layers) for w in per_block]
    return [*blocks, NormSite("ln_final")]


def _replace_with(activation: Tensor, hook: HookPoint, value: Tensor) -> Tensor:
    # Per-head inputs run a block's ln1 once per q/k/v input; all share this shape.
    return value.to(device=activation.device, dtype=activation.dtype).expand_as(activation)


def _zero_heads(z: Float[Tensor, "batch pos head d_head"], hook: HookPoint, heads: list[int]):
    z = z.clone()
    z[:, :, heads] = 0.0
    return z


def frozen_pattern_hooks(
    model: HookedTransformer,
    clean_cache: ActivationCache,
    *,
    freeze_norm_scales: bool = False,
) -> list[Hook]:
    """Forward hooks that replace every attention layer's `hook_pattern` with `clean_cache`'s
    (a hybrid's mixers mix as they would).

    With `freeze_norm_scales`, every norm's `hook_scale` too, which makes an attention-only
    model linear in its residual stream. Use them with `model.hooks(...)` or
    `run_with_hooks`; the input must have the clean run's shape.
    """
    keys = [get_act_name("pattern", layer) for layer in model.cfg.attention_layers]
    if freeze_norm_scales:
        keys += [site.hook("scale") for site in norm_sites(model)]
    hooks = []
    for key in keys:
        if key not in clean_cache:
            raise KeyError(f"the clean cache has no {key}, needed to freeze it")
        if not clean_cache.has_batch_dim:
            raise ValueError("the clean cache must keep its batch axis (no remove_batch_dim)")
        hooks.append((key, functools.partial(_replace_with, value=clean_cache[key])))
    return hooks


def pattern_preserving_hooks(
    model: HookedTransformer,
    clean_cache: ActivationCache,
    heads: HeadSpec | Sequence[HeadSpec],
    *,
    freeze_norm_scales: bool = False,
) -> list[Hook]:
    """`frozen_pattern_hooks` plus hooks that zero the `z` (so the result) of `heads`."""
    cfg = model.cfg
    by_layer: dict[int, list[int]] = {}
    one = isinstance(heads, str | Component) or is_head_pair(heads)
    specs = [heads] if one else list(heads)
    if not specs:
        raise ValueError(
            "no heads to ablate: give e.g. 'L1H2', (1, 2), Component('z', 1, head=2) or a list"
        )
    cfg.require_one_attention_shape("pattern ablation")
    for spec in specs:
        layer, head = parse_head(spec, cfg.n_layers, cfg.n_heads)
        by_layer.setdefault(layer, []).append(head)
    zeroing = [
        (get_act_name("z", layer), functools.partial(_zero_heads, heads=sorted(set(hs))))
        for layer, hs in sorted(by_layer.items())
    ]
    return frozen_pattern_hooks(model, clean_cache, freeze_norm_scales=freeze_norm_scales) + zeroing


def pattern_preserving_ablation(
    model: HookedTransformer,
    tokens: Int[Tensor, "batch pos"],
    heads: HeadSpec | Sequence[HeadSpec],
    *,
    clean_cache: ActivationCache | None = None,
    freeze_norm_scales: bool = False,
    **forward_kwargs: Any,
) -> Float[Tensor, "batch pos d_vocab_out"]:
    """The logits with `heads` zero-ablated and every attention pattern frozen.

    `heads` is one head (`"L1H2"`, `(1, 2)` or `Component("z", 1, head=2)`) or a list.
    The patterns (and, with `freeze_norm_scales`, the norm scales) are those of
    `clean_cache`, or of a clean run on `tokens` when it is not given. `forward_kwargs`
    (e.g. `attention_mask`) go to both runs. Zeroing `z` removes the head's `b_V` term
    too: it flows through the head.
    """
    if "return_type" in forward_kwargs:
        raise TypeError(
            "pattern_preserving_ablation returns logits; use the hooks of "
            "pattern_preserving_hooks with run_with_hooks for other outputs"
        )
    if clean_cache is None:
        keys = [get_act_name("pattern", layer) for layer in range(model.cfg.n_layers)]
        keys += [site.hook("scale") for site in norm_sites(model)]
        with torch.no_grad():
            _, clean_cache = model.run_with_cache(
                tokens, names_filter=keys, return_type=None, **forward_kwargs
            )
    hooks = pattern_preserving_hooks(
        model, clean_cache, heads, freeze_norm_scales=freeze_norm_scales
    )
    return model.run_with_hooks(tokens, fwd_hooks=hooks, **forward_kwargs)
