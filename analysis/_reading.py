"""Reading a cache and a model's weights the same way in every analysis function.

Private helpers: a cached activation always with its batch axis (a cache made with
`remove_batch_dim=True` reads as a batch of one), weights detached and cast to the
activations' dtype (a cache may be recorded in float64 from a float32 model), and the
component labels people type back in (`"L1H2"`, `"L1H2 pos 4"`, `"L0N42"`), built here
and nowhere else in `analysis`.
"""

import re

from torch import Tensor

from hookedattn.cache import ActivationCache

_HEAD_LABEL = re.compile(r"^L(\d+)H(\d+)$")

HeadSpec = str | tuple[int, int]


def activation(cache: ActivationCache, key: str | tuple) -> Tensor:
    """`cache[key]`, with a leading batch axis of size one when the cache has none."""
    t = cache[key]
    return t if cache.has_batch_dim else t[None]


def weight(w: Tensor, like: Tensor) -> Tensor:
    """A weight, detached from autograd, on the device and in the dtype of `like`."""
    return w.detach().to(device=like.device, dtype=like.dtype)


def head_label(layer: int, head: int) -> str:
    """`"L{layer}H{head}"`, the label of one attention head."""
    return f"L{layer}H{head}"


def component_label(layer: int, head: int | None = None, pos: int | None = None) -> str:
    """`"L1H6 pos 11"`, `"L1H6"`, `"L0 pos 4"` or `"L0"`: where a component lies, in the
    spelling of `head_label` (the one label style of every analysis result)."""
    where = f"L{layer}" if head is None else head_label(layer, head)
    return where if pos is None else f"{where} pos {pos}"


def neuron_label(layer: int, neuron: int) -> str:
    """`"L{layer}N{neuron}"`, the label of one MLP neuron."""
    return f"L{layer}N{neuron}"


def parse_head(spec: object, n_layers: int, n_heads: int) -> tuple[int, int]:
    """`(layer, head)` from `"L1H2"` or `(1, 2)`; negative indices count from the end."""
    if isinstance(spec, str):
        match = _HEAD_LABEL.match(spec)
        if not match:
            raise ValueError(
                f"a head is 'L<layer>H<head>' (e.g. 'L1H2') or (layer, head); got {spec!r}"
            )
        layer, head = int(match.group(1)), int(match.group(2))
    elif (
        isinstance(spec, tuple)
        and len(spec) == 2
        and all(isinstance(i, int) and not isinstance(i, bool) for i in spec)
    ):
        layer, head = spec
    else:
        raise TypeError(f"a head is 'L<layer>H<head>' (e.g. 'L1H2') or (layer, head); got {spec!r}")
    if not -n_layers <= layer < n_layers:
        raise ValueError(f"layer {layer} of head {spec!r} is out of range 0..{n_layers - 1}")
    if not -n_heads <= head < n_heads:
        raise ValueError(f"head {head} of {spec!r} is out of range 0..{n_heads - 1}")
    return layer % n_layers, head % n_heads
