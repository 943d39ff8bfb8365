"""The unpatched runs a sweep starts from: their logits, metric and the activations kept.

Both runs are checked once here for every method: the token batches paired, the metric's
reads within the declared positions (when declared), and a warning where they tie.
"""

import dataclasses
from collections.abc import Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from analysis.patching._inputs import (
    Metric,
    check_metric_reads,
    declared_positions,
    metric_values,
    paired_tokens,
    warn_if_tied,
)
from hookedattn import ActivationCache, HookedTransformer
from hookedattn.names import get_act_name


@dataclasses.dataclass(frozen=True)
class BaseRun:
    """An unpatched run: the tokens, their logits and metric, and the activations kept."""

    tokens: Int[Tensor, "batch pos"]
    logits: Float[Tensor, "batch pos d_vocab_out"]
    metric: Float[Tensor, " batch"]
    cache: ActivationCache


def key_name(model: HookedTransformer, layer: int) -> str:
    """The hook whose keys the KV cache holds: after rotation, where a model rotates them."""
    rotated = get_act_name("rot_k", layer)
    return rotated if rotated in model.hook_dict else get_act_name("k", layer)


def base_run(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], metric: Metric, names: Sequence[str]
) -> BaseRun:
    """Run `tokens` unpatched, keeping `names` and what the passes start from."""
    starts = [
        name
        for layer in range(model.cfg.n_layers)
        for name in (
            get_act_name("resid_pre", layer),
            key_name(model, layer),
            get_act_name("v", layer),
        )
    ]
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=sorted({*names, *starts}))
        values = metric_values(metric, logits)
    return BaseRun(tokens, logits, values.detach(), cache)


@dataclasses.dataclass(frozen=True)
class BaseRuns:
    """Both unpatched runs of a sweep, and the positions the metric declares it reads."""

    clean: BaseRun
    corrupted: BaseRun
    declared: tuple[int, ...] | None


def base_runs(
    model: HookedTransformer,
    clean_tokens: object,
    corrupted_tokens: object,
    metric: Metric,
    names: Sequence[str],
    metric_positions: object,
) -> BaseRuns:
    """Both runs, checked: the tokens paired, the metric's reads within `metric_positions`
    (when given), and a warning where the two runs tie."""
    clean_tokens, corrupted_tokens = paired_tokens(model, clean_tokens, corrupted_tokens)
    clean = base_run(model, clean_tokens, metric, names)
    corrupted = base_run(model, corrupted_tokens, metric, names)
    warn_if_tied(clean.metric, corrupted.metric, stacklevel=4)
    if metric_positions is None:
        return BaseRuns(clean, corrupted, None)
    declared = declared_positions(metric_positions, clean_tokens.shape[1])
    for run in (clean, corrupted):
        check_metric_reads(metric, run.logits, run.metric, declared, metric_positions)
    return BaseRuns(clean, corrupted, declared)
