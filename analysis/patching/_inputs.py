"""What a sweep starts from: the caller's token batches, metric and declared positions,
checked, and the two unpatched runs (their logits, metric and the activations kept).

Both runs are checked once here for every method: the token batches paired, the metric's
reads within the declared positions (when declared), and a warning where they tie.
"""

import dataclasses
import operator
import warnings
from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float, Int
from torch import Tensor

from analysis.patching._plan import runs_from_the_start
from hookedattn import ActivationCache, HookedTransformer
from hookedattn.core import names as _names
from hookedattn.core.names import get_act_name

Metric = Callable[[Tensor], Tensor]


def as_tokens(model: HookedTransformer, tokens: object, what: str) -> Int[Tensor, "batch pos"]:
    """`tokens` as a `[batch pos]` tensor of ids (a `[pos]` tensor is a batch of one)."""
    if isinstance(tokens, ActivationCache):
        raise TypeError(
            f"{what} must be token ids, got an ActivationCache: hookedattn's patching "
            f"functions take both token batches, clean_tokens= and corrupted_tokens=, "
            f"not TransformerLens's (corrupted_tokens, clean_cache) order"
        )
    if isinstance(tokens, str | list) and model.tokenizer is not None:
        tokens = model.to_tokens(tokens)
    if not isinstance(tokens, Tensor):
        raise TypeError(f"{what} must be token ids, a [batch pos] tensor; got {type(tokens)}")
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise TypeError(f"{what} must be integer token ids, got a {tokens.dtype} tensor")
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2:
        raise ValueError(f"{what} must be [batch pos] token ids, got shape {tuple(tokens.shape)}")
    return tokens.to(model.cfg.device)


def paired_tokens(
    model: HookedTransformer, clean: object, corrupted: object
) -> tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
    """Clean and corrupted ids, which must have one shape: patches move position by position."""
    clean, corrupted = as_tokens(model, clean, "clean"), as_tokens(model, corrupted, "corrupted")
    if clean.numel() == 0:
        raise ValueError(
            f"the clean prompts have shape {tuple(clean.shape)}: give at least one prompt of "
            f"at least one token"
        )
    if clean.shape != corrupted.shape:
        raise ValueError(
            f"clean tokens have shape {tuple(clean.shape)} but corrupted tokens "
            f"{tuple(corrupted.shape)}: patching swaps activations prompt by prompt and "
            f"position by position, so both must be [batch pos] of one shape"
        )
    return clean, corrupted


def metric_values(
    metric: Metric, logits: Float[Tensor, "batch pos d_vocab_out"]
) -> Float[Tensor, " batch"]:
    """`metric(logits)`, which must be one real number per prompt (shape `[batch]`)."""
    value = metric(logits)
    batch = logits.shape[0]
    if not isinstance(value, Tensor):
        raise TypeError(
            f"the metric must return a tensor with one value per prompt, shape ({batch},); "
            f"got {type(value).__name__}"
        )
    if value.shape != (batch,) or not value.dtype.is_floating_point:
        hint = " (drop a final .mean() or .sum())" if value.ndim == 0 else ""
        raise ValueError(
            f"the metric must return one value per prompt, a float tensor of shape "
            f"({batch},); got shape {tuple(value.shape)} and dtype {value.dtype}{hint}"
        )
    return value


def check_direction(direction: str) -> str:
    """`direction` if it is `"denoising"` or `"noising"`, else a `ValueError`."""
    if direction not in ("denoising", "noising"):
        raise ValueError(f"direction must be 'denoising' or 'noising', got {direction!r}")
    return direction


def warn_if_tied(
    clean: Float[Tensor, " batch"], corrupted: Float[Tensor, " batch"], stacklevel: int = 3
) -> None:
    """A `UserWarning` when both runs score the same: every normalised score is then 0/0.
    `stacklevel` points it at the caller of the public function."""
    if bool(clean.mean() == corrupted.mean()):
        warnings.warn(
            f"the clean and corrupted runs give the same mean metric ({float(clean.mean()):.6g}), "
            f"e.g. because their tokens are equal: normalised scores divide by the "
            f"difference of the two and are NaN; patch between prompts that differ",
            UserWarning,
            stacklevel=stacklevel,
        )


def declared_positions(metric_positions: object, n_pos: int) -> tuple[int, ...]:
    """`metric_positions` (an int or a sequence of ints; negative ones count from the end)
    as sorted, distinct positions in `0..n_pos-1`."""
    if _is_int(metric_positions):
        given = [metric_positions]
    elif isinstance(metric_positions, str) or not isinstance(metric_positions, Sequence | Tensor):
        raise TypeError(
            f"metric_positions must be a position or a sequence of positions (ints), "
            f"got {type(metric_positions).__name__}"
        )
    else:
        given = list(metric_positions)
    positions = set()
    for item in given:
        if not _is_int(item):
            raise TypeError(f"metric_positions must hold ints, got {item!r}")
        index = operator.index(item)
        if not -n_pos <= index < n_pos:
            raise ValueError(
                f"metric_positions: {index} is not a position of {n_pos} tokens "
                f"(valid: {-n_pos}..{n_pos - 1})"
            )
        positions.add(index % n_pos)
    if not positions:
        raise ValueError(
            "metric_positions is empty: declare the positions whose logits the metric "
            "reads, or pass None"
        )
    return tuple(sorted(positions))


def _is_int(value: object) -> bool:
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def nan_except(
    logits: Float[Tensor, "batch pos d_vocab_out"], kept: Sequence[int]
) -> Float[Tensor, "batch pos d_vocab_out"]:
    """A copy of `logits` that is NaN at every position but `kept`."""
    out = torch.full_like(logits, torch.nan)
    out[:, list(kept)] = logits[:, list(kept)]
    return out


def _same(a: Tensor, b: Tensor) -> bool:
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


def check_metric_reads(
    metric: Metric,
    logits: Float[Tensor, "batch pos d_vocab_out"],
    values: Float[Tensor, " batch"],
    declared: Sequence[int],
    given: object,
) -> None:
    """A `ValueError` naming the undeclared positions whose logits `metric` reads, if any:
    its `values` on `logits` must not change when they are NaN."""
    n_pos = logits.shape[1]
    if _same(metric_values(metric, nan_except(logits, declared)), values):
        return
    others = [q for q in range(n_pos) if q not in declared]
    reads = [
        q
        for q in others
        if not _same(
            metric_values(metric, nan_except(logits, [p for p in range(n_pos) if p != q])), values
        )
    ]
    where = f"positions {reads}" if reads else "positions outside them taken together"
    hint = f"pass metric_positions={sorted({*declared, *reads})} or None" if reads else "pass None"
    raise ValueError(
        f"metric_positions={given!r} declares positions {list(declared)} of {n_pos}, but the "
        f"metric also reads the logits at {where} (its value changes when they are NaN); "
        f"{hint}"
    )


@dataclasses.dataclass(frozen=True)
class BaseRun:
    """An unpatched run: the tokens, their logits and metric, and the activations kept."""

    tokens: Int[Tensor, "batch pos"]
    logits: Float[Tensor, "batch pos d_vocab_out"]
    metric: Float[Tensor, " batch"]
    cache: ActivationCache


def key_name(model: HookedTransformer, layer: int) -> str:
    """The hook whose keys the KV cache holds: the last of `k`, the key norm's output and
    the rotation that the model has."""
    for kind in ("rot_k", "k_norm_out"):
        if (name := get_act_name(kind, layer)) in model.hook_dict:
            return name
    return get_act_name("k", layer)


def value_name(model: HookedTransformer, layer: int) -> str:
    """The hook whose values the KV cache holds: the value norm's output where the model
    norms its values (Gemma 4's `use_v_norm`), else `v`."""
    name = get_act_name("v_norm_out", layer)
    return name if name in model.hook_dict else get_act_name("v", layer)


def base_run(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], metric: Metric, names: Sequence[str]
) -> BaseRun:
    """Run `tokens` unpatched, keeping `names` and what the passes start from."""
    return _base_runs(model, [tokens], metric, names)[0]


def prompts_of(cache: ActivationCache, rows: slice) -> dict[str, Tensor]:
    """The activations of prompts `rows` of a cache of several batches run together. An
    expert's rows (`names.is_rows`) are in `(batch, pos, slot)` order, so the prompts'
    are the ones routed from among them (the routing must be in the cache too)."""
    out = {}
    for name, t in cache.items():
        if not _names.is_rows(name):
            out[name] = t[rows]
            continue
        layer, expert = _names.layer_of(name), _names.expert_of(name)
        chosen = cache[f"blocks.{layer}.mlp.hook_expert_indices"] == expert
        first, n = int(chosen[: rows.start].sum()), int(chosen[rows].sum())
        out[name] = t[first : first + n]
    return out


def _refuse_shared_keys(model: HookedTransformer) -> None:
    """A ValueError where blocks read earlier blocks' keys and values
    (`n_kv_shared_layers`): a pass starts at a block with a KV cache of each block's own
    recorded keys and values, which such a block has none of, and the block it reads from
    may lie before the pass."""
    n = model.cfg.n_kv_shared_layers
    if n:
        raise ValueError(
            f"the patching sweep runs each block from a KV cache of its own recorded keys "
            f"and values; this model's last {n} blocks read those of earlier blocks "
            f"(n_kv_shared_layers={n}), which it does not carry: patch with hooks on whole "
            f"forwards (model.hooks, run_with_hooks) instead"
        )


def _base_runs(
    model: HookedTransformer,
    batches: Sequence[Int[Tensor, "batch pos"]],
    metric: Metric,
    names: Sequence[str],
) -> list[BaseRun]:
    """Each of `batches` run unpatched (in one forward: prompts do not interact), keeping
    `names` and what the passes start from."""
    _refuse_shared_keys(model)
    kept = () if runs_from_the_start(model) else (key_name, value_name)  # a pass's past
    starts = [
        name
        for layer in range(model.cfg.n_layers)
        for name in (
            get_act_name("resid_pre", layer),
            *(name_of(model, layer) for name_of in kept),
        )
    ]
    with torch.no_grad():
        logits, cache = model.run_with_cache(
            torch.cat(list(batches)), names_filter=sorted({*names, *starts})
        )
    runs, first = [], 0
    for tokens in batches:
        rows = slice(first, first + tokens.shape[0])
        first = rows.stop
        kept = ActivationCache(prompts_of(cache, rows), model.cfg.n_layers)
        values = metric_values(metric, logits[rows])
        runs.append(BaseRun(tokens, logits[rows], values.detach(), kept))
    return runs


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
    clean, corrupted = _base_runs(model, [clean_tokens, corrupted_tokens], metric, names)
    warn_if_tied(clean.metric, corrupted.metric, stacklevel=4)
    if metric_positions is None:
        return BaseRuns(clean, corrupted, None)
    declared = declared_positions(metric_positions, clean_tokens.shape[1])
    for run in (clean, corrupted):
        check_metric_reads(metric, run.logits, run.metric, declared, metric_positions)
    return BaseRuns(clean, corrupted, declared)
