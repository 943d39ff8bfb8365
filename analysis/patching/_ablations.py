"""Ablations: remove what a component carries, and see what the model does without it.

Three ways to remove it (Heimersheim & Nanda 2024, "How to use and interpret activation
patching", section 2), each replacing the component's region of the activation:

- `"zero"`: by zeros. Simple, but zero may be far from anything the model ever sees.
- `"mean"`: by its mean over a reference batch, position by position: what the component
  carries on average, without what is specific to this prompt.
- `"resample"`: by its value on a randomly drawn prompt of the reference batch (one draw
  per prompt and component, seeded): a value the model does see, from an unrelated input.

With `preserve_patterns=True` every attention pattern is also frozen to its unablated
value (the pattern-preserving ablation of `_pattern_ablation`, whose hooks are used here),
so that later heads keep looking where they looked. More in `docs/guide/patching.md`.
"""

from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from analysis._naming import Component
from analysis.patching.engine import (
    as_tokens,
    check_component,
    component_masks,
    frozen_pattern_hooks,
)
from hookedattn import ActivationCache, HookedTransformer
from hookedattn.core.names import get_act_name, pos_axis

METHODS: tuple[str, ...] = ("zero", "mean", "resample")
Hook = tuple[str, Callable[..., Tensor]]


def ablation_hooks(
    model: HookedTransformer,
    components: Component | Sequence[Component],
    method: str = "zero",  # "zero", "mean" or "resample"
    *,
    reference: Tensor | ActivationCache | None = None,
    seed: int = 0,
) -> list[Hook]:
    """Forward hooks that ablate `components`, for `model.hooks(...)` or `run_with_hooks`.

    `reference` (token ids `[batch pos]`, or a cache of them holding the components'
    activations) is the batch that mean and resample ablation draw from; it must have as
    many positions as the runs the hooks go into.
    """
    components = [components] if isinstance(components, Component) else list(components)
    if not components:
        raise ValueError("nothing to ablate: give a Component or a list of them")
    if method not in METHODS:
        raise ValueError(f"method must be one of {', '.join(map(repr, METHODS))}, got {method!r}")
    if (method == "zero") != (reference is None):
        need = "takes no reference" if method == "zero" else "needs a reference batch"
        raise ValueError(f"{method} ablation {need} (reference=)")
    cache = _reference_cache(model, components, reference)
    n_pos = _n_pos(model, components, cache)
    hooks = []
    for i, component in enumerate(components):
        check_component(model, component, n_pos)
        values = None if cache is None else cache[component.hook_name]
        hooks.append((component.hook_name, _ablating(component, method, values, seed + i)))
    return hooks


def ablate(
    model: HookedTransformer,
    tokens: Tensor,
    components: Component | Sequence[Component],
    method: str = "zero",  # "zero", "mean" or "resample"
    *,
    reference: Tensor | ActivationCache | None = None,
    seed: int = 0,
    preserve_patterns: bool = False,
) -> Float[Tensor, "batch pos d_vocab_out"]:
    """The logits of `tokens` with `components` ablated (see the module docstring)."""
    tokens = as_tokens(model, tokens, "tokens")
    hooks = ablation_hooks(model, components, method, reference=reference, seed=seed)
    if preserve_patterns:
        patterns = [get_act_name("pattern", layer) for layer in model.cfg.attention_layers]
        with torch.no_grad():
            _, clean_cache = model.run_with_cache(tokens, names_filter=patterns)
        hooks = frozen_pattern_hooks(model, clean_cache) + hooks
    with model.hooks(fwd_hooks=hooks):
        return model(tokens)


def _reference_cache(
    model: HookedTransformer,
    components: Sequence[Component],
    reference: Tensor | ActivationCache | None,
) -> ActivationCache | None:
    if reference is None or isinstance(reference, ActivationCache):
        return reference
    tokens = as_tokens(model, reference, "reference")
    names = sorted({c.hook_name for c in components})
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=names)
    return cache


def _n_pos(
    model: HookedTransformer, components: Sequence[Component], cache: ActivationCache | None
) -> int:
    """How many positions the components may index: the reference's, else the context's."""
    if cache is None:
        return model.cfg.n_ctx
    name = components[0].hook_name
    return cache[name].shape[pos_axis(name)]


def _ablating(
    component: Component, method: str, reference: Tensor | None, seed: int
) -> Callable[..., Tensor]:
    """A hook replacing `component`'s region by what `method` puts there."""

    def ablate_hook(activation: Tensor, hook) -> Tensor:
        n_pos = activation.shape[pos_axis(hook.name)]
        if component.pos is not None and component.pos >= n_pos:
            raise ValueError(f"cannot ablate {component.label()}: the run has {n_pos} positions")
        region = component_masks([component], hook.name, activation.shape[1:])[0]
        region = region.to(activation.device)
        if method == "zero":
            # Masked attention scores stay -inf: zero there would unmask the future.
            return torch.where(region & activation.isfinite(), 0.0, activation)
        _check_positions(reference, activation, hook.name)
        if method == "mean":
            value = reference.mean(dim=0, keepdim=True)
        else:
            generator = torch.Generator().manual_seed(seed)
            draws = torch.randint(len(reference), (activation.shape[0],), generator=generator)
            value = reference[draws.to(reference.device)]
        return torch.where(region, value.to(activation.dtype), activation)

    return ablate_hook


def _check_positions(reference: Tensor, activation: Tensor, name: str) -> None:
    if reference.shape[1:] != activation.shape[1:]:
        raise ValueError(
            f"at {name} the reference batch has shape {tuple(reference.shape[1:])} per "
            f"prompt but the ablated run {tuple(activation.shape[1:])}: mean and resample "
            f"ablation replace position by position, so both need the same length"
        )
