"""Views of a weight kept between calls: its transpose for a product, its heads flattened.

A view is a dispatcher call (`W.T`, `W.flatten(0, 1)`): made again by every product of a
one-token decode step, the model's views cost as much as some of its products. Where no
gradient is recorded for the weight, `kept_view` keeps the view on the weight itself and
makes it again only when the weight's storage changes (`W.data = ...`) or inference mode
does; an edit in place is seen through the view, which shares the storage (a view of the
weight detached, so that the weight is still freed when its module is). Where a gradient
is recorded, a view is made afresh each time (a kept one, made without grad, would carry
none back to its weight).
"""

from collections.abc import Callable

import torch
from torch import Tensor


def kept_view(weight: Tensor, name: str, make: Callable[[Tensor], Tensor]) -> Tensor:
    """`make(weight)`, a view of `weight`, kept on it under `name` (module docstring)."""
    # Under torch.compile the graph holds the view: nothing to keep (and a tensor's
    # instance dict is not traceable).
    if (weight.requires_grad and torch.is_grad_enabled()) or torch.compiler.is_compiling():
        return make(weight)
    key = (weight.data_ptr(), torch.is_inference_mode_enabled())
    kept = weight.__dict__.get(name)
    if kept is None or kept[0] != key:
        # Of the weight detached: a view of the weight itself would hold it from C++, and
        # kept on it, make it a cycle that only the garbage collector frees.
        kept = weight.__dict__[name] = (key, make(weight.detach()))
    return kept[1]


def transposed(weight: Tensor) -> Tensor:
    """`weight.T`, kept (`kept_view`): what `F.linear` takes for `x @ weight`."""
    return kept_view(weight, "_hookedattn_T", _T)


def _T(weight: Tensor) -> Tensor:
    return weight.T
