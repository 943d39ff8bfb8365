"""Feature interventions in the replacement model: set features, watch the logits.

    logits = intervene(model, transcoders, prompt, [FeatureIntervention(1, 7, 42, 0.0)])

Two models to intervene in:

- the replacement model as it runs (`freeze=False`): later layers respond in full, their
  attention and norms recomputed and their error terms too (each the MLP's output on its
  new input minus the transcoder's prediction from its clean features);
- the local replacement model (`freeze=True`): the attention patterns, norm scales and
  error terms stay those of the unedited prompt, the linearisation an attribution graph
  describes. There a small change of one feature moves each logit by the graph's
  `total_effects` to first order (exactly, while no feature crosses its threshold), and
  with `freeze_features=True` (every other feature held at its clean value too) by the
  graph's direct edge alone.

More in `docs/guide/transcoders.md`.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from analysis.attribution_graphs._frozen import prompt_tokens
from analysis.patching.engine import frozen_pattern_hooks, norm_sites
from hookedattn.core.names import get_act_name
from hookedattn.sae import TranscoderSet, replaced, transcoder_hook_name


@dataclasses.dataclass(frozen=True)
class FeatureIntervention:
    """Set feature `feature` of layer `layer` at position `pos` to `value` (0 ablates it)."""

    layer: int
    pos: int
    feature: int
    value: float


def intervene(
    model: Any,
    transcoders: Any,
    prompt: Any,
    interventions: Sequence[FeatureIntervention],
    *,
    freeze: bool = False,
    freeze_features: bool = False,
) -> Float[Tensor, "pos d_vocab_out"]:
    """The logits of the replacement model on `prompt` (text or ids `[pos]`) with each
    intervention's feature set to its value (module docstring for `freeze`;
    `freeze_features` needs `freeze`)."""
    tset = TranscoderSet(transcoders)
    tokens = prompt_tokens(model, prompt)[None]
    if freeze_features and not freeze:
        raise ValueError("freeze_features holds features at their values in the frozen model: "
                         "it needs freeze=True")  # fmt: skip
    by_layer = _by_layer(tset, interventions, tokens.shape[1])
    clean = _clean_cache(model, tset, tokens) if freeze else None
    hooks = []
    if freeze:
        hooks += frozen_pattern_hooks(model, clean, freeze_norm_scales=True)
        for layer in tset.layers:
            name = transcoder_hook_name(layer, "hook_error")
            hooks.append((name, lambda e, hook, kept=clean[name]: kept.clone()))
    for layer in tset.layers:
        kept = clean[transcoder_hook_name(layer, "hook_acts")] if freeze_features else None
        if by_layer.get(layer) or kept is not None:
            hooks.append((transcoder_hook_name(layer, "hook_acts"),
                          _setter(by_layer.get(layer, []), kept)))  # fmt: skip
    with torch.no_grad(), replaced(model, tset), model.hooks(fwd_hooks=hooks):
        return model(tokens)[0]


def _by_layer(tset: TranscoderSet, interventions: Any, n_pos: int) -> dict[int, list]:
    if isinstance(interventions, FeatureIntervention):
        interventions = [interventions]
    out: dict[int, list] = {}
    for i in interventions:
        if not isinstance(i, FeatureIntervention):
            raise TypeError(f"interventions must be FeatureInterventions, got {i!r}")
        if i.layer not in tset.layers or not 0 <= i.pos < n_pos:
            raise ValueError(f"{i}: layer must be one of {tset.layers} and pos in 0..{n_pos - 1}")
        if not 0 <= i.feature < tset.d_sae(i.layer):
            raise ValueError(f"{i}: feature must be in 0..{tset.d_sae(i.layer) - 1}")
        out.setdefault(i.layer, []).append(i)
    return out


def _setter(chosen: list[FeatureIntervention], kept: Tensor | None):
    def hook(acts: Tensor, hook: Any) -> Tensor:
        acts = (acts if kept is None else kept).clone()
        for i in chosen:
            acts[:, i.pos, i.feature] = i.value
        return acts

    return hook


def _clean_cache(model: Any, tset: TranscoderSet, tokens: Tensor) -> Any:
    """The unedited replacement forward's patterns, norm scales, error terms and features."""
    n = model.cfg.n_layers
    names = [get_act_name("pattern", layer) for layer in range(n)]
    names += [site.hook("scale") for site in norm_sites(model)]
    names += [transcoder_hook_name(layer, h) for layer in tset.layers
              for h in ("hook_error", "hook_acts")]  # fmt: skip
    with torch.no_grad(), replaced(model, tset):
        _, cache = model.run_with_cache(tokens, names_filter=names, return_type=None)
    return cache
