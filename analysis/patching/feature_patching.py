"""Patching SAE features: exact (one forward per feature) and first-order (one backward).

With the SAE spliced with its error term, the corrupted run's features are replaced by the
clean run's, one feature at a time at every position (denoising). Because the error term
is the unedited one (see `hookedattn.sae.autoencoder`), a patched feature changes the
stream by exactly `(clean_f - corrupted_f) · W_dec[f]`. `feature_attribution_patch`
estimates each patch as the metric's gradient at `hook_acts` times that difference, summed
over positions (gradient × activation: Syed et al. 2023; Marks et al. 2024 for features);
`feature_activation_patch` runs each patch. Both return a `PatchingResult` of kind
`sae_features` over the axis `feature`, so `compare_patching(approx, exact)` tells where the
first-order estimate fails.

More in `docs/guide/saes.md`.
"""

import dataclasses
from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from analysis.patching.engine import (
    Metric,
    metric_gradients,
    metric_values,
    paired_tokens,
    warn_if_tied,
)
from analysis.patching.result import PatchingResult
from hookedattn.core.model import HookedTransformer
from hookedattn.sae import SparseAutoencoder, sae_hook_name, spliced

KIND = "sae_features"


@dataclasses.dataclass(frozen=True)
class _Runs:
    """The clean and corrupted runs with the SAE spliced: features and metrics."""

    corrupted_tokens: Int[Tensor, "batch pos"]
    acts_name: str
    clean_acts: Float[Tensor, "batch pos d_sae"]
    corrupted_acts: Float[Tensor, "batch pos d_sae"]
    clean: Float[Tensor, " batch"]
    corrupted: Float[Tensor, " batch"]


def _runs(
    model: HookedTransformer,
    sae: SparseAutoencoder,
    clean: object,
    corrupted: object,
    metric: Metric,
) -> _Runs:
    clean, corrupted = paired_tokens(model, clean, corrupted)
    acts_name = sae_hook_name(sae.cfg.hook_name, "hook_acts")
    # `spliced`, not `model.saes`: a subclass (SAELens's HookedSAETransformer) redefines that.
    with torch.no_grad(), spliced(model, [sae]):
        clean_logits, cache = model.run_with_cache(clean, names_filter=acts_name)
        corrupted_logits, corrupted_cache = model.run_with_cache(corrupted, names_filter=acts_name)
    clean_metric = metric_values(metric, clean_logits)
    corrupted_metric = metric_values(metric, corrupted_logits)
    warn_if_tied(clean_metric, corrupted_metric, stacklevel=4)
    return _Runs(
        corrupted,
        acts_name,
        cache[acts_name],
        corrupted_cache[acts_name],
        clean_metric,
        corrupted_metric,
    )


def _features(
    clean_acts: Float[Tensor, "batch pos d_sae"],
    corrupted_acts: Float[Tensor, "batch pos d_sae"],
    features: Sequence[int] | None,
) -> list[int]:
    """The features given, or those active somewhere in either run."""
    if features is not None:
        return [int(f) for f in features]
    active = ((clean_acts != 0) | (corrupted_acts != 0)).flatten(0, -2).any(0)
    return active.nonzero().flatten().tolist()


def _result(
    method: str,
    features: list[int],
    per_prompt: Float[Tensor, "feature batch"],
    runs: _Runs,
) -> PatchingResult:
    labels = (tuple(f"F{f}" for f in features),)
    return PatchingResult(
        method, "denoising", KIND, ("feature",), labels, per_prompt, runs.clean, runs.corrupted
    )


def feature_attribution_patch(
    model: HookedTransformer,
    sae: SparseAutoencoder,
    clean_tokens: object,
    corrupted_tokens: object,
    metric: Metric,
    features: Sequence[int] | None = None,
) -> PatchingResult:
    """First-order estimate of patching each feature's clean activations into the
    corrupted run (module docstring); `features` defaults to those active in either run."""
    runs = _runs(model, sae, clean_tokens, corrupted_tokens, metric)
    chosen = _features(runs.clean_acts, runs.corrupted_acts, features)
    with spliced(model, [sae]):
        forward = lambda: metric_values(metric, model(runs.corrupted_tokens))
        grad = metric_gradients(model, [runs.acts_name], forward).gradients[runs.acts_name]
    delta = (runs.clean_acts - runs.corrupted_acts)[..., chosen]
    scores = (grad[..., chosen] * delta).sum(1).T
    return _result("attribution patching", chosen, runs.corrupted + scores, runs)


@torch.no_grad()
def feature_activation_patch(
    model: HookedTransformer,
    sae: SparseAutoencoder,
    clean_tokens: object,
    corrupted_tokens: object,
    metric: Metric,
    features: Sequence[int] | None = None,
) -> PatchingResult:
    """The metric with each feature's clean activations patched into the corrupted run,
    one forward per feature (module docstring)."""
    runs = _runs(model, sae, clean_tokens, corrupted_tokens, metric)
    chosen = _features(runs.clean_acts, runs.corrupted_acts, features)
    rows = []
    with spliced(model, [sae]):
        for f in chosen:

            def patch(acts: Tensor, hook, f: int = f) -> Tensor:
                acts = acts.clone()
                acts[..., f] = runs.clean_acts[..., f]
                return acts

            with model.hooks([(runs.acts_name, patch)]):
                rows.append(metric_values(metric, model(runs.corrupted_tokens)))
    empty = runs.corrupted.new_zeros(0, runs.corrupted.shape[0])
    per_prompt = torch.stack(rows) if rows else empty
    return _result("activation patching", chosen, per_prompt, runs)
