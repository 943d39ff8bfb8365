"""Reading a cache and a model's weights the same way in every analysis function.

Private helpers: a cached activation always with its batch axis (a cache made with
`remove_batch_dim=True` reads as a batch of one), weights detached and cast to the
activations' dtype (a cache may be recorded in float64 from a float32 model). Names and
labels of heads and components are `analysis._naming`'s.
"""

from torch import Tensor

from hookedattn.core.cache import ActivationCache


def activation(cache: ActivationCache, key: str | tuple) -> Tensor:
    """`cache[key]`, with a leading batch axis of size one when the cache has none."""
    t = cache[key]
    return t if cache.has_batch_dim else t[None]


def weight(w: Tensor, like: Tensor) -> Tensor:
    """A weight, detached from autograd, on the device and in the dtype of `like`."""
    return w.detach().to(device=like.device, dtype=like.dtype)
