"""The definition of activation patching: one forward pass per patched component.

Run the target prompts once per component, with that component's region of its activation
replaced by the source run's, and measure. Slow and plain on purpose: the batched engine
(`_sweep`) must give exactly these numbers, and the tests check that it does for every
kind, direction, option and model variant.

More in `docs/guide/patching.md`.
"""

from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from analysis.patching import _experts
from analysis.patching._components import EXPERT_KINDS, LAYOUTS, Component
from analysis.patching._inputs import Metric, metric_values
from hookedattn import ActivationCache, HookedTransformer


def region(component: Component) -> tuple[int | slice, ...]:
    """The index of `component`'s region in its `[batch ...]` activation."""
    layout = ("batch", *LAYOUTS[component.name])
    index: list[int | slice] = [slice(None)] * len(layout)
    for axis, value in (
        ("pos", component.pos),
        ("head", component.head),
        ("expert", component.expert),
    ):
        if value is not None:
            index[layout.index(axis)] = value
    return tuple(index)


def reference_sweep(
    model: HookedTransformer,
    target: Int[Tensor, "batch pos"],
    source: ActivationCache,
    components: Sequence[Component],
    metric: Metric,
) -> Float[Tensor, "component batch"]:
    """`metric` of `target`'s run with each component patched from `source`, one at a time."""
    rows = []
    for component in components:
        index = region(component)

        def patch(activation: Tensor, hook, index=index) -> Tensor:
            patched = activation.clone()
            patched[index] = source[hook.name][index]
            return patched

        if component.name in EXPERT_KINDS:  # an expert's write: see `_experts`
            hooks = _experts.reference_hooks(model, component, source)
        else:
            hooks = [(component.hook_name, patch)]
        with torch.no_grad():
            logits = model.run_with_hooks(target, fwd_hooks=hooks)
        rows.append(metric_values(metric, logits))
    return torch.stack(rows)
