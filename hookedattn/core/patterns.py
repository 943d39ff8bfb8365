"""Every layer's attention pattern, recorded and stacked into one tensor.

What the head detectors (`analysis.head_detectors`) and the attention view
(`hookedattn.viewer`) both read: a score or a heatmap per head needs the pattern of every
query position, so a cache that lacks some (made with `pos_slice`, or over a KV cache) is
refused by name here, once.
"""

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from hookedattn.core.cache import ActivationCache
from hookedattn.core.model import HookedTransformer
from hookedattn.core.names import get_act_name


def record_patterns(model: HookedTransformer, tokens: Any) -> ActivationCache:
    """A cache of `model` on `tokens` (anything its forward takes) that holds the attention
    patterns and nothing else (of the blocks with attention: `cfg.attention_layers`)."""
    names = [get_act_name("pattern", layer) for layer in model.cfg.attention_layers]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=names, return_type=None)
    return cache


def stacked_patterns(
    cache: ActivationCache, layers: Sequence[int], reader: str
) -> Float[Tensor, "layer *batch head query_pos key_pos"]:
    """The patterns of `layers` in `cache`, stacked on a leading layer axis.

    A `ValueError` saying that `reader` needs every query position unless each pattern is
    square.
    """
    stacked = torch.stack([cache["pattern", layer] for layer in layers])
    if stacked.shape[-2] != stacked.shape[-1]:
        raise ValueError(
            f"patterns of shape {tuple(stacked.shape[1:])} are not square (a cache made with "
            f"pos_slice or a KV cache); {reader} needs every query position"
        )
    return stacked
