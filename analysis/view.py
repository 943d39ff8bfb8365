"""Interactive pages of analysis results, and the compact tables notebooks show of them.

    from analysis import view
    view.attention(model, cache, tokens)             # every head's pattern (hookedattn.viewer)
    view.logit_attribution(model, cache, dla)        # per-token bars, one per component
    view.decomposition(model, cache, decomp)         # the same for a residual decomposition
    view.patching(result)                            # a PatchingResult as a heatmap

Each returns a `hookedattn.viewer.Page`: `page.save("x.html")` writes one self-contained
file, and a notebook displays it. The `*_table` functions are the `_repr_html_` of the
results (a cache's lives in `hookedattn`).
"""

import itertools
import math
from typing import Any

from jaxtyping import Float
from torch import Tensor

from analysis._resid_stack import ResidStack
from analysis.attribution import LogitAttribution
from analysis.head_detectors import HeadScores
from analysis.patching.result import PatchingResult
from hookedattn.core.cache import ActivationCache
from hookedattn.core.model import HookedTransformer
from hookedattn.viewer import Page, attention, token_strings

__all__ = [
    "attention",
    "decomposition",
    "head_scores_table",
    "logit_attribution",
    "patching",
    "patching_table",
    "resid_stack_table",
]


def _bars_page(
    title: str,
    what: str,
    labels: tuple[str, ...],
    values: Float[Tensor, "component pos"],
    tokens: list[str],
    pos: int,
) -> Page:
    n = values.shape[1]
    if not -n <= pos < n:
        raise ValueError(f"pos must be in -{n}..{n - 1}, got {pos}")
    data = {
        "kind": "bars",
        "what": what,
        "labels": list(labels),
        "tokens": tokens,
        # [pos component]: one list of bars per token, as the page shows them.
        "values": values.detach().double().cpu().T.tolist(),
        "start_pos": pos % n,
    }
    return Page(title, data, height=min(1600, 260 + 22 * len(labels)))


def logit_attribution(
    model: HookedTransformer,
    cache: ActivationCache,
    dla: LogitAttribution,
    tokens: Any = None,
    *,
    batch: int = 0,
    pos: int = -1,
    title: str | None = None,
) -> Page:
    """Each component's direct contribution to the logit, as sortable bars per token.

    Click a token to see the bars at its position (the last one first); `tokens` as in
    `attention` (strings, ids, or read off the cache). The bars of a position add up to
    the model's logit (or logit difference) there.
    """
    values = dla.contributions[:, batch]
    strings = token_strings(model, cache, tokens, batch, values.shape[1])
    what = f"direct attribution to the {dla.metric}"
    return _bars_page(title or what, what, dla.labels, values, strings, pos)


def decomposition(
    model: HookedTransformer,
    cache: ActivationCache,
    decomp: ResidStack,
    tokens: Any = None,
    *,
    direction: Float[Tensor, " d_model"] | None = None,
    batch: int = 0,
    pos: int = -1,
    title: str | None = None,
) -> Page:
    """A residual decomposition's components as sortable bars per token.

    The bars are each component's norm, or with `direction` its projection onto it
    (`component @ direction`, which adds up over components to the stream's projection).
    """
    components = decomp.components[:, batch]
    if direction is None:
        values, what = components.norm(dim=-1), "norm"
    else:
        if direction.shape[-1] != components.shape[-1]:
            raise ValueError(
                f"direction has {direction.shape[-1]} entries, the stream {components.shape[-1]}"
            )
        values = components @ direction.to(components.device, components.dtype)
        what = "projection onto the direction"
    strings = token_strings(model, cache, tokens, batch, values.shape[1])
    what = f"{what} of each component of {decomp.hook_name}"
    return _bars_page(
        title or f"{type(decomp).__name__}: {what}", what, decomp.labels, values, strings, pos
    )


def _flat(values: Float[Tensor, "..."]) -> list[float | None]:
    # JSON has no NaN: a tied baseline's NaN travels as null and shows as "NaN".
    return [None if math.isnan(v) else v for v in values.detach().double().flatten().tolist()]


def patching(result: PatchingResult, title: str | None = None) -> Page:
    """A patching result as a heatmap (first two axes; a chooser for any further axis),
    normalised scores, patched metrics or effects on hover, the baselines beside it."""
    data = {
        "kind": "patching",
        "method": result.method,
        "direction": result.direction,
        "patch_kind": result.kind,
        "axes": list(result.axes),
        "labels": [list(map(str, ticks)) for ticks in result.labels],
        # Each cell's own label, as `result.label` writes it (`L1H3`), row-major.
        "cell_labels": [
            result.label(index) for index in itertools.product(*map(range, result.shape))
        ],
        "values": _flat(result.values),
        "normalised": _flat(result.normalised),
        "effect": _flat(result.effect),
        "clean": result.clean_baseline,
        "corrupted": result.corrupted_baseline,
        "n_prompts": int(result.clean.shape[0]),
    }
    rows = len(result.labels[0]) if len(result.axes) > 1 else 1
    default = f"{result.method} ({result.direction}) of {result.kind}"
    return Page(title or default, data, height=min(1400, 320 + 14 * rows))


# --------------------------------------------------------------- notebook tables
def resid_stack_table(stack: ResidStack, batch: int = 0, pos: int = -1) -> str:
    """The `_repr_html_` of a decomposition: each component's norm at one position."""
    return stack._repr_html_(batch, pos)


def head_scores_table(scores: HeadScores) -> str:
    """The `_repr_html_` of head scores: a `[layer head]` grid, the baseline above it."""
    return scores._repr_html_()


def patching_table(result: PatchingResult) -> str:
    """The `_repr_html_` of a patching result: its normalised scores as a grid (two axes
    that fit), or its largest effects, under the baselines."""
    return result._repr_html_()
