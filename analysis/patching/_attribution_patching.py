"""Attribution patching (Nanda 2023, "Attribution Patching: Activation Patching at
Industrial Scale"): activation patching to first order, for every component at once.

Patching activation `a` from `a_run` to `a_other` moves the metric by about
`(a_other - a_run) . d metric / d a`, the gradient taken in the run being patched. One
forward pass of the other run (for `a_other`), one of the patched run with the gradient
recorded, and one backward pass give that for every component of every kind; summing the
products over a component's region gives its score. It is exact where the metric is
linear in the activation (the last block's outputs, with no final norm) and drifts where
the patch crosses a nonlinearity; `compare_patching` shows where.

More in `docs/guide/patching.md`.
"""

import dataclasses
from collections.abc import Iterator, Mapping, Sequence

import torch
from einops import reduce
from jaxtyping import Float
from torch import Tensor

from analysis.patching._components import (
    LAYOUTS,
    UNSUPPORTED,
    available_kinds,
    check_kind,
    component_grid,
    kind_layers,
    refuse_unsupported,
)
from analysis.patching._gradients import metric_gradients
from analysis.patching._inputs import (
    Metric,
    check_direction,
    metric_values,
    paired_tokens,
    warn_if_tied,
)
from analysis.patching.result import PatchingResult
from hookedattn import HookedTransformer
from hookedattn.core.names import get_act_name


@dataclasses.dataclass(frozen=True)
class PatchingResults(Mapping[str, PatchingResult]):
    """One `PatchingResult` per component kind, read-only: `results["z"]`."""

    results: Mapping[str, PatchingResult]

    def __getitem__(self, kind: str) -> PatchingResult:
        try:
            return self.results[kind]
        except KeyError:
            raise KeyError(f"no {kind!r} here; kinds: {', '.join(self.results)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.results)

    def __len__(self) -> int:
        return len(self.results)

    def __repr__(self) -> str:
        lines = [f"PatchingResults: {len(self)} kinds"]
        lines += [f"  {kind}: {result!r}" for kind, result in self.results.items()]
        return "\n".join(lines)


def attribution_patch(
    model: HookedTransformer,
    kinds: str | Sequence[str] | None = None,
    *,
    # [batch pos] token ids, loosely annotated so that a mismatch (a cache passed in
    # TransformerLens's order, a wrong dtype or shape) gets our own message.
    clean_tokens: object,
    corrupted_tokens: object,
    metric: Metric,
    by_pos: bool | None = None,
    direction: str = "denoising",
) -> PatchingResults:
    """First-order activation patching of every component of `kinds` (all kinds by default).

    Returns, per kind, a `PatchingResult` laid out as `activation_patch` lays it out, whose
    `per_prompt` is the patched run's metric plus the first-order change, so the two can be
    compared directly (`compare_patching`). `direction` and `by_pos` as in
    `activation_patch`. The model's parameters and their `.grad` are left untouched.
    """
    clean_tokens, corrupted_tokens = paired_tokens(model, clean_tokens, corrupted_tokens)
    check_direction(direction)
    kinds = _checked_kinds(model, kinds)
    names = [get_act_name(k, layer) for k in kinds for layer in kind_layers(model, k)]
    denoising = direction == "denoising"
    patched, source = (
        (corrupted_tokens, clean_tokens) if denoising else (clean_tokens, corrupted_tokens)
    )
    with torch.no_grad():
        source_logits, source_cache = model.run_with_cache(source, names_filter=names)
        source_metric = metric_values(metric, source_logits)
    run = metric_gradients(model, names, lambda: metric_values(metric, model(patched)))
    patched_metric, activations, grads = run.value, run.activations, run.gradients
    clean, corrupted = (
        (source_metric, patched_metric) if denoising else (patched_metric, source_metric)
    )
    warn_if_tied(clean, corrupted)
    results = {}
    for kind in kinds:
        grid = component_grid(model, kind, patched.shape[1], by_pos)
        layers = [get_act_name(kind, layer) for layer in kind_layers(model, kind)]
        scores = torch.stack(
            [
                _region_sums(kind, grid.axes, source_cache[n], activations[n], grads[n])
                for n in layers
            ]
        )
        per_prompt = patched_metric + scores
        results[kind] = PatchingResult(
            "attribution patching",
            direction,
            kind,
            grid.axes,
            grid.labels,
            per_prompt,
            clean,
            corrupted,
        )
    return PatchingResults(results)


def _checked_kinds(model: HookedTransformer, kinds: str | Sequence[str] | None) -> list[str]:
    if kinds is None:
        skipped = UNSUPPORTED["attribution patching"]
        kinds = [k for k in available_kinds(model) if k not in skipped]
    kinds = [check_kind(model, k) for k in ([kinds] if isinstance(kinds, str) else kinds)]
    for kind in kinds:
        refuse_unsupported(kind, "attribution patching")
    if not kinds:
        raise ValueError("no component kinds to attribute")
    return kinds


def _region_sums(
    kind: str, axes: tuple[str, ...], source: Tensor, patched: Tensor, grad: Tensor
) -> Float[Tensor, "..."]:
    """`(source - patched) . grad` summed over each component's region.

    Returns `[*axes batch]` without the layer axis.
    """
    delta = source - patched
    if "key_pos" in LAYOUTS[kind]:
        # Masked attention scores are -inf in both runs: no change there, not NaN.
        delta = delta.nan_to_num_(nan=0.0)
    layout = " ".join(LAYOUTS[kind])
    kept = " ".join(a for a in axes if a != "layer")
    return reduce(delta * grad, f"batch {layout} -> {kept} batch", "sum")
