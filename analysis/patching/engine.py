"""Many patched variants of one forward pass, run together.

A sweep patches one component per variant. Instead of one forward pass per variant, the
variants are stacked along the batch axis (`(variant batch)`) and each hook point replaces,
in every variant at once, the region that variant patches (`torch.where` with a
`[variant 1 ...]` mask). Three facts about a causal transformer make each stacked pass
shorter, without changing any number:

- a patch in block L leaves blocks 0..L-1 as they were, so the pass starts at block L
  from the unpatched run's `resid_pre` (`start_at_layer`);
- a patch at position p leaves positions 0..p-1 as they were, so the pass runs positions
  p.. only, reading the earlier keys and values of the unpatched run from a frozen
  `KeyValueCache`, and the earlier logits are the unpatched ones;
- a patch downstream of where its block mixes positions (a head's output, an MLP, ...)
  changes that block's output at its own position only, so the block runs on the
  patched positions alone (`LOCAL_KINDS`); in the last block nothing else runs.

Variants are sorted by (layer, position) and cut into chunks whose estimated memory fits a
budget; a chunk starts at its first variant's layer and position. When the caller declares
which positions' logits the metric reads (`metric_positions`), `declared.py` and
`side_by_side.py` run less still.
"""

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence

import torch
from einops import rearrange, repeat
from jaxtyping import Bool, Float, Int
from torch import Tensor

from analysis.patching.components import LOCAL_KINDS, Component, component_masks
from analysis.patching.inputs import Metric, metric_values
from hookedattn import ActivationCache, HookedTransformer, KeyValueCache, KeyValueCacheEntry
from hookedattn.names import get_act_name, pos_axis


def default_memory_budget(model: HookedTransformer) -> int:
    """Bytes of activations one stacked pass may hold, unless the caller says otherwise.

    On a CPU, passes whose activations stay within the caches run fastest (measured:
    16-32 MiB beat 256 MiB by 1.5-2x on a 2-layer model); an accelerator wants big passes.
    """
    return 32 * 2**20 if torch.device(model.cfg.device).type == "cpu" else 2**30


@dataclasses.dataclass(frozen=True)
class BaseRun:
    """An unpatched run: the tokens, their logits and metric, and the activations kept."""

    tokens: Int[Tensor, "batch pos"]
    logits: Float[Tensor, "batch pos d_vocab_out"]
    metric: Float[Tensor, " batch"]
    cache: ActivationCache


def base_run(
    model: HookedTransformer, tokens: Int[Tensor, "batch pos"], metric: Metric, names: Sequence[str]
) -> BaseRun:
    """Run `tokens` unpatched, keeping `names` and what stacked passes start from."""
    keep = sorted(set(names) | set(_start_names(model)))
    with torch.no_grad():
        logits, cache = model.run_with_cache(tokens, names_filter=keep)
        values = metric_values(metric, logits)
    return BaseRun(tokens, logits, values.detach(), cache)


def _key_name(model: HookedTransformer, layer: int) -> str:
    # The KV cache holds keys after rotation, where a model rotates them.
    rotated = get_act_name("rot_k", layer)
    return rotated if rotated in model.hook_dict else get_act_name("k", layer)


def _start_names(model: HookedTransformer) -> list[str]:
    return [
        name
        for layer in range(model.cfg.n_layers)
        for name in (
            get_act_name("resid_pre", layer),
            _key_name(model, layer),
            get_act_name("v", layer),
        )
    ]


@dataclasses.dataclass(frozen=True)
class Edit:
    """In variant i, replace the region `mask[i]` of the activation at `hook` by `source`.

    `mask` spans every position; `source` is `[batch ...]` (one for all variants) or
    `[variant batch ...]` (one per variant).
    """

    hook: str
    mask: Bool[Tensor, "variant 1 ..."]
    source: Tensor


@dataclasses.dataclass(frozen=True)
class VariantRun:
    """What a stacked pass returns: logits per variant and the activations asked for."""

    logits: Float[Tensor, "variant batch pos d_vocab_out"]
    recorded: Mapping[str, Tensor]  # name -> [variant batch ...]


def run_variants(
    model: HookedTransformer,
    base: BaseRun,
    n_variants: int,
    edits: Sequence[Edit],
    start_layer: int = 0,
    start_pos: int = 0,
    local_end: int | None = None,
    record: Sequence[str] = (),
) -> VariantRun:
    """One forward pass of `n_variants` edited copies of `base`, from a layer and position.

    Every edit must lie in block `start_layer` or later and at position `start_pos` or
    later (or the variants would differ before the pass starts). Recording needs
    `start_pos == 0`, since earlier positions are not run.

    `local_end`: the edits lie in block `start_layer` only, each at one position before
    `local_end`, downstream of where the block mixes positions (see `LOCAL_KINDS`). Then
    the block's output changes at positions `start_pos..local_end-1` only, so the block
    runs on those alone and the pass goes on from its output and the unpatched rest.
    """
    assert not (record and (start_pos or local_end)), "recording needs every position"
    recorded: dict[str, Tensor] = {}

    def keep(activation: Tensor, hook) -> None:
        recorded[hook.name] = _by_variant(activation, n_variants)

    end = base.tokens.shape[1] if local_end is None else local_end
    hooks = [(e.hook, _edit_hook(e, n_variants, start_pos, end)) for e in edits]
    hooks += [(name, keep) for name in record]
    resid = _rows(base, start_layer, start_pos, end, n_variants)
    with torch.no_grad():
        if local_end is None:
            past = _frozen_prefix(model, base.cache, n_variants, start_layer, start_pos)
            with model.hooks(fwd_hooks=hooks):
                logits = model(resid, start_at_layer=start_layer, past_kv_cache=past)
            return VariantRun(_splice(base.logits, logits, start_pos, n_variants), recorded)
        past = _frozen_prefix(model, base.cache, n_variants, start_layer, start_pos, 1)
        with model.hooks(fwd_hooks=hooks):
            resid = model(
                resid, start_at_layer=start_layer, stop_at_layer=start_layer + 1, past_kv_cache=past
            )
        next_layer = start_layer + 1
        if next_layer < model.cfg.n_layers:
            rest = _rows(base, next_layer, local_end, base.tokens.shape[1], n_variants)
            resid = torch.cat([resid, rest], dim=1)
        # With no block left, positions no longer mix: the rows after the window keep
        # their unpatched logits.
        past = _frozen_prefix(model, base.cache, n_variants, next_layer, start_pos)
        logits = model(resid, start_at_layer=next_layer, past_kv_cache=past)
    return VariantRun(_splice(base.logits, logits, start_pos, n_variants), recorded)


def _rows(base: BaseRun, layer: int, start: int, end: int, n_variants: int) -> Tensor:
    """The unpatched residual stream entering `layer` at positions `start..end-1`, per variant."""
    return repeat(
        base.cache[get_act_name("resid_pre", layer)][:, start:end],
        "batch pos d_model -> (variant batch) pos d_model",
        variant=n_variants,
    )


def _splice(
    base_logits: Float[Tensor, "batch pos d_vocab_out"],
    logits: Float[Tensor, "variant_batch run_pos d_vocab_out"],
    start_pos: int,
    n_variants: int,
) -> Float[Tensor, "variant batch pos d_vocab_out"]:
    """Each variant's logits: unpatched outside `start_pos..`, `logits` there."""
    logits = _by_variant(logits, n_variants)
    end = start_pos + logits.shape[2]
    if start_pos == 0 and end == base_logits.shape[1]:
        return logits
    expand = lambda x: x.expand(n_variants, -1, -1, -1)
    return torch.cat([expand(base_logits[:, :start_pos]), logits, expand(base_logits[:, end:])], 2)


def _by_variant(x: Tensor, n_variants: int) -> Tensor:
    return rearrange(x, "(variant batch) ... -> variant batch ...", variant=n_variants)


def _edit_hook(edit: Edit, n_variants: int, start: int, end: int) -> Callable:
    """A hook applying `edit` in a pass over positions `start..end-1`."""
    axis = pos_axis(edit.hook) + 1  # of a [variant batch ...] tensor
    mask = _window(edit.mask.to(edit.source.device), axis, start, end)
    source = edit.source if edit.source.ndim == mask.ndim else edit.source[None]
    source = _window(source, axis, start, end)
    if axis == 3:  # scores and patterns: their key axis ends where the pass ends
        source = source[..., :end]

    def patch(activation: Tensor, hook) -> Tensor:
        patched = torch.where(mask, source, _by_variant(activation, n_variants))
        return rearrange(patched, "variant batch ... -> (variant batch) ...")

    return patch


def _window(x: Tensor, axis: int, start: int, end: int) -> Tensor:
    """Positions `start..end-1` of `x` along `axis` (a broadcast axis of size 1 stays)."""
    if x.shape[axis] == 1 or (start, end) == (0, x.shape[axis]):
        return x
    return x.narrow(axis, start, end - start)


def _frozen_prefix(
    model: HookedTransformer,
    cache: ActivationCache,
    n_variants: int,
    start_layer: int,
    start_pos: int,
    n_blocks: int | None = None,
) -> KeyValueCache | None:
    """The unpatched keys and values of positions `..start_pos`, shared by every variant,
    for `n_blocks` blocks from `start_layer` (all the rest by default)."""
    n_layers = model.cfg.n_layers
    stop = n_layers if n_blocks is None else start_layer + n_blocks
    if not start_pos or start_layer >= n_layers:
        return None
    entries = {}
    for layer in range(start_layer, stop):
        keys, values = (
            repeat(
                cache[name][:, :start_pos],
                "batch pos head d_head -> (variant batch) pos head d_head",
                variant=n_variants,
            )
            for name in (_key_name(model, layer), get_act_name("v", layer))
        )
        entries[layer] = KeyValueCacheEntry(keys, values, frozen=True)
    # Blocks outside start_layer..stop-1 do not run, so their entries are never read.
    filled = [entries[min(max(layer, start_layer), stop - 1)] for layer in range(n_layers)]
    name = get_act_name("v", start_layer)
    batch = cache[name].shape[0]
    mask = torch.ones(n_variants * batch, start_pos, dtype=torch.long, device=cache[name].device)
    return KeyValueCache(filled, mask, frozen=True)


# --------------------------------------------------------------------- sweeps
def bytes_per_sequence(model: HookedTransformer, n_run: int, n_pos: int) -> int:
    """Estimated peak bytes of one sequence in a stacked pass over `n_run` of `n_pos` positions.

    Counts the largest activations alive at once (residual stream, q/k/v/z, scores and
    pattern, MLP hidden layer, logits) with some slack; the full-length logits handed
    to the metric; and the frozen keys and values of the positions not run.
    """
    cfg = model.cfg
    per_position = row_floats(model, n_pos) + 3 * cfg.d_vocab_out
    prefix = 2 * cfg.n_layers * cfg.n_heads * cfg.d_head * (n_pos - n_run)
    return itemsize(model) * (n_run * per_position + n_pos * cfg.d_vocab_out + prefix)


def row_floats(model: HookedTransformer, n_keys: int) -> int:
    """Numbers one position holds at the peak of a block attending to `n_keys` keys
    (residual stream, q/k/v/z, scores and pattern, MLP hidden layer), with some slack."""
    cfg = model.cfg
    return (
        8 * cfg.d_model
        + 6 * cfg.n_heads * cfg.d_head
        + 3 * cfg.n_heads * n_keys
        + 3 * (cfg.d_mlp or 0)
    )


def itemsize(model: HookedTransformer) -> int:
    """Bytes of one number in the model's dtype."""
    return torch.empty((), dtype=model.cfg.dtype).element_size()


# What one stacked pass costs beyond its rows (two forwards' Python and dispatch), in
# rows run. Tuned on a 2-layer model on a CPU (0, 32, 128, 512, 1024 tried): wasted rows
# cost more than extra passes there, so passes rarely span positions.
_PASS_COST_ROWS = 128


def plan_chunks(
    model: HookedTransformer,
    components: Sequence[Component],
    batch: int,
    n_pos: int,
    memory_budget: int | None = None,
) -> list[list[int]]:
    """Indices of `components`, cut into stacked passes that fit `memory_budget` bytes.

    Sorted by (layer, position) so that each pass starts as late as it can; a pass never
    mixes layers. A pass runs every variant from its first variant's position, so the
    patches at the next position join it only while the rows that wastes cost less than
    a pass of their own. A single variant larger than the budget still runs, alone.
    """
    return merge_passes(
        components,
        range(len(components)),
        lambda chunk: _bytes(model, components, chunk, batch, n_pos),
        lambda chunk: _pass_rows(model, components, chunk, batch, n_pos),
        memory_budget=default_memory_budget(model) if memory_budget is None else memory_budget,
    )


def merge_passes(
    components: Sequence[Component],
    indices: Iterable[int],
    bytes_of: Callable[[list[int]], int],
    rows_of: Callable[[list[int]], int],
    memory_budget: int,
) -> list[list[int]]:
    """`indices` of `components` in passes (see `plan_chunks`), given what a pass of some
    of them costs: `bytes_of(chunk)` at its peak and `rows_of(chunk)` rows run."""
    if memory_budget <= 0:
        raise ValueError(f"memory_budget must be a positive number of bytes, got {memory_budget}")
    order = sorted(indices, key=lambda i: _start(components[i]))
    chunks: list[list[int]] = []
    for _, group in itertools.groupby(order, key=lambda i: _start(components[i])):
        group = list(group)
        size = max(1, memory_budget // bytes_of(group[:1]))
        for piece in (group[i : i + size] for i in range(0, len(group), size)):
            if chunks:
                merged = chunks[-1] + piece
                fits = bytes_of(merged) <= memory_budget
                extra = rows_of(merged) - rows_of(chunks[-1]) - rows_of(piece)
                same_layer = components[chunks[-1][0]].layer == components[piece[0]].layer
                if same_layer and fits and extra <= _PASS_COST_ROWS:
                    chunks[-1] = merged
                    continue
            chunks.append(piece)
    return chunks


def _extent(
    model: HookedTransformer, components: Sequence[Component], chunk: list[int], n_pos: int
) -> tuple[int, int, int, bool]:
    """A pass's layer, first position, positions run by its first block, and whether the
    blocks after it run too."""
    chosen = [components[i] for i in chunk]
    layer, start = _start(chosen[0])
    local_end = _local_end(chosen)
    later = model.cfg.n_layers - layer - 1
    window = n_pos - start if local_end is None else local_end - start
    return layer, start, window, local_end is None or later > 0


def _pass_rows(
    model: HookedTransformer,
    components: Sequence[Component],
    chunk: list[int],
    batch: int,
    n_pos: int,
) -> int:
    """Rows a pass runs: positions times blocks, plus the positions it unembeds."""
    layer, start, window, goes_on = _extent(model, components, chunk, n_pos)
    later = model.cfg.n_layers - layer - 1
    per_prompt = window + ((n_pos - start) * (later + 1) if goes_on else window)
    return len(chunk) * batch * per_prompt


def _bytes(
    model: HookedTransformer,
    components: Sequence[Component],
    chunk: list[int],
    batch: int,
    n_pos: int,
) -> int:
    """Estimated peak bytes of a pass (see `bytes_per_sequence`)."""
    _, start, window, goes_on = _extent(model, components, chunk, n_pos)
    n_run = n_pos - start if goes_on else window
    return len(chunk) * batch * bytes_per_sequence(model, n_run, n_pos)


def _start(component: Component) -> tuple[int, int]:
    return component.layer, component.pos or 0


def _local_end(components: Sequence[Component]) -> int | None:
    """Where the window of changed positions ends, if the patches change their block's
    output only at their own positions (see `run_variants`); else None."""
    if all(c.name in LOCAL_KINDS and c.pos is not None for c in components):
        return max(c.pos for c in components) + 1
    return None


def sweep(
    model: HookedTransformer,
    base: BaseRun,
    sources: Mapping[str, Tensor],
    components: Sequence[Component],
    metric: Metric,
    memory_budget: int | None = None,
) -> Float[Tensor, "component batch"]:
    """The metric with each component of `base` replaced by `sources[its hook name]`.

    `sources` maps hook names to `[batch ...]` activations shaped like the base run's.
    """
    batch, n_pos = base.tokens.shape
    out = base.metric.new_empty(len(components), batch)
    for chunk in plan_chunks(model, components, batch, n_pos, memory_budget):
        chosen = [components[i] for i in chunk]
        hooks = list(dict.fromkeys(c.hook_name for c in chosen))
        edits = [
            Edit(hook, component_masks(chosen, hook, sources[hook].shape[1:]), sources[hook])
            for hook in hooks
        ]
        layer, pos = _start(chosen[0])
        local_end = _local_end(chosen)
        logits = run_variants(model, base, len(chosen), edits, layer, pos, local_end).logits
        out[chunk] = torch.stack([metric_values(metric, variant) for variant in logits])
    return out
