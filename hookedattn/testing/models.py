"""Models for tests in which no forgotten term can hide."""

import copy

import torch

from hookedattn.model import HookedTransformer


def randomize_parameters(
    model: HookedTransformer, scale: float = 0.5, seed: int = 1
) -> HookedTransformer:
    """A copy of `model` with every parameter drawn at random, biases and norm gains included.

    A freshly built model has zero biases and unit norm gains, under which a computation
    that forgets a bias or a gain still gives the right answer. Here every weight and bias
    is `N(0, scale^2)` and every norm gain (`.w`) is `1 + N(0, scale^2)`, drawn in float32
    from a generator seeded by `seed` (in `named_parameters` order) and cast to the
    model's dtype. The model passed in is left as it was.
    """
    model = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            values = torch.randn(param.shape, generator=generator) * scale
            param.copy_(values + (1.0 if name.endswith(".w") else 0.0))
    return model
