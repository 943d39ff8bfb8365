"""Tiny seeded models and tokens for tests, and models in which no forgotten term can hide.

    model = tiny_model(n_heads=2, attn_only=True)    # TINY_CONFIG with two fields changed
    model = random_tiny_model(normalization_type="RMS")  # every parameter drawn at random
    tokens = random_tokens(model.cfg.d_vocab, batch=2, pos=6, seed=2)

Everything is seeded: the same call gives the same weights and tokens on every run.
"""

import copy
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.model import HookedTransformer

TINY_CONFIG: dict[str, Any] = dict(
    n_layers=2, d_model=16, n_heads=4, n_ctx=16, d_vocab=32, d_mlp=64, dtype=torch.float64
)


def tiny_model(
    seed: int = 0, *, model_class: type[HookedTransformer] = HookedTransformer, **overrides: Any
) -> HookedTransformer:
    """A tiny model (`TINY_CONFIG`, float64) initialised from `seed`; `overrides` are any
    `HookedTransformerConfig` fields (`tokenizer=` goes to the model). `model_class` is a
    subclass to build instead (such as `hookedattn_tl.HookedTransformer`)."""
    tokenizer = overrides.pop("tokenizer", None)
    cfg = HookedTransformerConfig(**{**TINY_CONFIG, "seed": seed, **overrides})
    return model_class(cfg, tokenizer=tokenizer)


def random_tiny_model(
    seed: int = 0, scale: float = 0.5, randomize_seed: int = 1, **overrides: Any
) -> HookedTransformer:
    """`tiny_model(seed, **overrides)` with every parameter redrawn by
    `randomize_parameters(model, scale, randomize_seed)`: nonzero biases, gains away from one."""
    return randomize_parameters(tiny_model(seed, **overrides), scale, randomize_seed)


def random_tokens(d_vocab: int, batch: int, pos: int, seed: int = 0) -> Int[Tensor, "batch pos"]:
    """`[batch, pos]` token ids below `d_vocab`, uniform, from a generator seeded by `seed`."""
    return torch.randint(0, d_vocab, (batch, pos), generator=torch.Generator().manual_seed(seed))


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
