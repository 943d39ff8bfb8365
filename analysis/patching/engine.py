"""Many patched variants of one forward pass, run together.

A sweep patches one component per variant. Instead of one forward pass per variant, the
variants are stacked along the batch axis (`(variant batch)`) and each hook point replaces,
in every variant at once, the region that variant patches (`torch.where` with a
`[variant 1 ...]` mask). Two facts about a causal transformer make each stacked pass
shorter, without changing any number:

- a patch in block L leaves blocks 0..L-1 as they were, so the pass starts at block L
  from the unpatched run's `resid_pre` (`start_at_layer`);
- a patch at position p leaves positions 0..p-1 as they were, so the pass runs positions
  p.. only, reading the earlier keys and values of the unpatched run from a frozen
  `KeyValueCache`, and the earlier logits are the unpatched ones.

Variants are sorted by (layer, position) and cut into chunks whose estimated memory fits a
budget; a chunk starts at its first variant's layer and position.
"""

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import torch
from einops import rearrange, repeat
from jaxtyping import Bool, Float, Int
from torch import Tensor

from analysis.patching.components import Component, component_masks
from analysis.patching.inputs import Metric, metric_values
from hookedattn import ActivationCache, HookedTransformer, KeyValueCache, KeyValueCacheEntry
from hookedattn.names import get_act_name, pos_axis

DEFAULT_MEMORY_BUDGET = 256 * 2**20  # bytes of activations alive in one stacked pass


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
    record: Sequence[str] = (),
) -> VariantRun:
    """One forward pass of `n_variants` edited copies of `base`, from a layer and position.

    Every edit must lie in block `start_layer` or later and at position `start_pos` or
    later (or the variants would differ before the pass starts). Recording needs
    `start_pos == 0`, since earlier positions are not run.
    """
    assert not (record and start_pos), "recording needs every position"
    resid = repeat(
        base.cache[get_act_name("resid_pre", start_layer)][:, start_pos:],
        "batch pos d_model -> (variant batch) pos d_model",
        variant=n_variants,
    )
    past = _frozen_prefix(model, base.cache, n_variants, start_layer, start_pos)
    recorded: dict[str, Tensor] = {}

    def keep(activation: Tensor, hook) -> None:
        recorded[hook.name] = _by_variant(activation, n_variants)

    hooks = [(e.hook, _edit_hook(e, n_variants, start_pos)) for e in edits]
    hooks += [(name, keep) for name in record]
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        logits = model(resid, start_at_layer=start_layer, past_kv_cache=past)
    logits = _by_variant(logits, n_variants)
    if start_pos:
        earlier = base.logits[:, :start_pos].expand(n_variants, -1, -1, -1)
        logits = torch.cat([earlier, logits], dim=2)
    return VariantRun(logits, recorded)


def _by_variant(x: Tensor, n_variants: int) -> Tensor:
    return rearrange(x, "(variant batch) ... -> variant batch ...", variant=n_variants)


def _edit_hook(edit: Edit, n_variants: int, start_pos: int) -> Callable:
    axis = pos_axis(edit.hook)  # of a [batch ...] activation
    mask = _from_pos(edit.mask, axis + 1, start_pos)
    source = edit.source if edit.source.ndim == mask.ndim else edit.source[None]
    source = _from_pos(source, axis + 1, start_pos)

    def patch(activation: Tensor, hook) -> Tensor:
        patched = torch.where(mask, source, _by_variant(activation, n_variants))
        return rearrange(patched, "variant batch ... -> (variant batch) ...")

    return patch


def _from_pos(x: Tensor, axis: int, start_pos: int) -> Tensor:
    """Positions `start_pos..` of `x` along `axis` (a broadcast axis of size 1 stays)."""
    if not start_pos or x.shape[axis] == 1:
        return x
    return x.narrow(axis, start_pos, x.shape[axis] - start_pos)


def _frozen_prefix(
    model: HookedTransformer,
    cache: ActivationCache,
    n_variants: int,
    start_layer: int,
    start_pos: int,
) -> KeyValueCache | None:
    """The unpatched keys and values of positions `..start_pos`, shared by every variant."""
    if not start_pos:
        return None
    entries = {}
    for layer in range(start_layer, model.cfg.n_layers):
        keys, values = (
            repeat(
                cache[name][:, :start_pos],
                "batch pos head d_head -> (variant batch) pos head d_head",
                variant=n_variants,
            )
            for name in (_key_name(model, layer), get_act_name("v", layer))
        )
        entries[layer] = KeyValueCacheEntry(keys, values, frozen=True)
    # Blocks before start_layer do not run, so their entries are never read.
    filled = [entries[max(layer, start_layer)] for layer in range(model.cfg.n_layers)]
    mask = torch.ones(n_variants * cache[get_act_name("v", start_layer)].shape[0], start_pos)
    return KeyValueCache(filled, mask.to(torch.long), frozen=True)


# --------------------------------------------------------------------- sweeps
def bytes_per_sequence(model: HookedTransformer, n_run: int, n_pos: int) -> int:
    """Estimated peak bytes of one sequence in a stacked pass over `n_run` of `n_pos` positions.

    Counts the largest activations alive at once (residual stream, q/k/v/z, scores and
    pattern, MLP hidden layer, logits) with some slack; the full-length logits handed
    to the metric; and the frozen keys and values of the positions not run.
    """
    cfg = model.cfg
    per_position = (
        8 * cfg.d_model
        + 6 * cfg.n_heads * cfg.d_head
        + 3 * cfg.n_heads * n_pos
        + 3 * (cfg.d_mlp or 0)
        + 3 * cfg.d_vocab_out
    )
    prefix = 2 * cfg.n_layers * cfg.n_heads * cfg.d_head * (n_pos - n_run)
    itemsize = torch.empty((), dtype=cfg.dtype).element_size()
    return itemsize * (n_run * per_position + n_pos * cfg.d_vocab_out + prefix)


def plan_chunks(
    model: HookedTransformer,
    components: Sequence[Component],
    batch: int,
    n_pos: int,
    memory_budget: int,
) -> list[list[int]]:
    """Indices of `components`, cut into stacked passes that fit `memory_budget` bytes.

    Sorted by (layer, position) so that each pass starts as late as it can; a pass never
    mixes layers. A single variant larger than the budget still runs, alone.
    """
    if memory_budget <= 0:
        raise ValueError(f"memory_budget must be a positive number of bytes, got {memory_budget}")
    order = sorted(range(len(components)), key=lambda i: _start(components[i]))
    chunks: list[list[int]] = []
    for i in order:
        layer = components[i].layer
        if chunks:
            first_layer, first_pos = _start(components[chunks[-1][0]])
            size = (len(chunks[-1]) + 1) * batch
            cost = size * bytes_per_sequence(model, n_pos - first_pos, n_pos)
            if layer == first_layer and cost <= memory_budget:
                chunks[-1].append(i)
                continue
        chunks.append([i])
    return chunks


def _start(component: Component) -> tuple[int, int]:
    return component.layer, component.pos or 0


def sweep(
    model: HookedTransformer,
    base: BaseRun,
    sources: Mapping[str, Tensor],
    components: Sequence[Component],
    metric: Metric,
    memory_budget: int = DEFAULT_MEMORY_BUDGET,
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
        logits = run_variants(model, base, len(chosen), edits, layer, pos).logits
        out[chunk] = torch.stack([metric_values(metric, variant) for variant in logits])
    return out
