"""The gradient of a metric at hook points: the one backward every first-order method takes.

Attribution patching (`_attribution_patching`), feature attribution patching
(`feature_patching`) and edge attribution (`analysis.discovery.edge_attribution`, EAP and
EAP-IG) each estimate a patch as `delta . d metric / d activation`. `metric_gradients` runs
the forward it is given with a zero leaf added at each hook point and takes one
`torch.autograd.grad` of the metric's sum at the leaves: the gradient at a leaf is the
metric's gradient at that activation. Adding a leaf, rather than detaching the activation,
keeps the paths from one hook point through the later ones, works where no parameter needs
a gradient (frozen weights), and leaves the parameters' `.grad` alone; the backward runs
only from the metric down to the earliest leaf. Prompts do not interact, so the gradient of
the sum over prompts is each prompt's own. See `docs/guide/patching.md`.
"""

import dataclasses
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from hookedattn import HookedTransformer


@dataclasses.dataclass(frozen=True)
class MetricGradients:
    """What `metric_gradients` returns: `value`, what the forward returned (detached);
    `activations`, each hook point's activation (detached); `gradients`, the gradient of
    `value.sum()` at each (zeros where the value does not depend on it)."""

    value: Tensor
    activations: dict[str, Tensor]
    gradients: dict[str, Tensor]


def metric_gradients(
    model: HookedTransformer, names: Sequence[str], forward: Callable[[], Tensor]
) -> MetricGradients:
    """Run `forward()` (a forward of `model` that returns the metric, one value per prompt
    or already summed) with gradients on, and return the gradient of its sum at every hook
    point of `names` (module docstring). Hooks already attached to `model` run as usual."""
    leaves: dict[str, Tensor] = {}
    activations: dict[str, Tensor] = {}

    def capture(activation: Tensor, hook) -> Tensor:
        leaf = torch.zeros_like(activation).requires_grad_()
        leaves[hook.name] = leaf
        activations[hook.name] = activation.detach()
        return activation + leaf

    with torch.enable_grad(), model.hooks(fwd_hooks=[(name, capture) for name in names]):
        value = forward()
    if not isinstance(value, Tensor) or not value.requires_grad:
        raise ValueError(
            "the metric's value has no gradient: return a differentiable function of the "
            "logits (not one detached, turned into a number, or computed under "
            "torch.no_grad())"
        )
    order = list(leaves)
    grads = torch.autograd.grad(value.sum(), [leaves[n] for n in order], allow_unused=True)
    gradients = {
        name: torch.zeros_like(leaves[name]) if grad is None else grad
        for name, grad in zip(order, grads, strict=True)
    }
    return MetricGradients(value.detach(), activations, gradients)
