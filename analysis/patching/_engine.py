"""Many patched variants of one forward pass, run together: the batched `_reference`.

A sweep is a base run and `n_variants` variants of it, each a set of region replacements
(`Edit`: in variant i, the region `mask[i]` of one activation takes `source`'s values).
`sweep` gives the metric of every variant, `record` the activations some hook points see
in each. Both let `_plan` choose the passes and run each pass the same way: variants
stacked along the batch axis (`(variant batch)`), from the pass's first block, each
variant at its own positions, after the unpatched keys and values of the positions
before them (a frozen KV cache, masked per variant). Every step is a forward of the
model's own blocks (`start_at_layer`, `stop_at_layer`, `past_kv_cache`), so every hook
point on the way fires, and hooks attached to the model act as in any other forward
(those that index positions see a pass's own rows).

With `declared` positions (the only ones whose logits the metric reads) a pass stops at
the last of them, unembeds only them, and a variant that cannot reach them does not run;
the metric gets logits that are NaN elsewhere, so a metric reading another position
gives NaN, which is caught.
"""

import dataclasses
import time
from collections.abc import Callable, Sequence

import torch
from einops import rearrange, repeat
from jaxtyping import Bool, Float, Int
from torch import Tensor

from analysis.patching._components import LAYOUTS, LOCAL_KINDS, Component, component_masks
from analysis.patching._cost import default_memory_budget, pass_cost, row_floats
from analysis.patching._inputs import Metric, metric_values
from analysis.patching._logits import again, declared_logits, declared_metric, full_logits
from analysis.patching._plan import Extent, Pass, plan
from analysis.patching._runs import BaseRun, base_run, key_name
from hookedattn import ActivationCache, HookedTransformer
from hookedattn.kv_cache import KeyValueCache, KeyValueCacheEntry
from hookedattn.names import get_act_name


@dataclasses.dataclass(frozen=True)
class Edit:
    """In variant i, replace the region `mask[i]` of activation `kind` of block `layer`
    by `source`: `[batch ...]` (one for every variant) or `[variant batch ...]`."""

    kind: str
    layer: int
    mask: Bool[Tensor, "variant 1 ..."]
    source: Tensor

    @property
    def hook(self) -> str:
        """The full hook name."""
        return get_act_name(self.kind, self.layer)

    def source_of(self, variants: Tensor) -> Tensor:
        """The source of `variants`, `[variant batch ...]` (variant axis of size 1 if shared)."""
        per_variant = self.source.ndim == self.mask.ndim
        return self.source[variants] if per_variant else self.source[None]


def component_edits(components: Sequence[Component], source: ActivationCache) -> list[Edit]:
    """One edit per hook point of `components`: variant i takes component i's region from
    `source`."""
    firsts = {c.hook_name: c for c in components}.values()
    return [
        Edit(
            c.name,
            c.layer,
            component_masks(components, c.hook_name, source[c.hook_name].shape[1:]),
            source[c.hook_name],
        )
        for c in firsts
    ]


def extents(edits: Sequence[Edit], n_variants: int, n_pos: int) -> list[Extent | None]:
    """Where each variant's edits lie (None for a variant that no edit touches)."""
    big = n_pos * 1000 + 10**6
    layer = torch.full((n_variants,), big)
    start, window_end = torch.full((n_variants,), big), torch.zeros(n_variants, dtype=torch.long)
    touched_by = []
    for edit in edits:
        mask = edit.mask.cpu().expand(n_variants, *edit.mask.shape[1:])
        pos = 2 + LAYOUTS[edit.kind].index("pos")
        hits = mask.movedim(pos, 1).flatten(2).any(2)  # [variant pos]
        touched = hits.any(1)
        if hits.shape[1] == 1:
            first, end = torch.zeros(n_variants, dtype=torch.long), torch.full((n_variants,), n_pos)
        else:
            first = hits.int().argmax(1)
            end = hits.shape[1] - hits.flip(1).int().argmax(1)
        layer = torch.where(touched, layer.clamp(max=edit.layer), layer)
        start = torch.where(touched, torch.minimum(start, first), start)
        window_end = torch.where(touched, torch.maximum(window_end, end), window_end)
        touched_by.append((edit, touched))
    local, keyed = (
        torch.ones(n_variants, dtype=torch.bool),
        torch.zeros(n_variants, dtype=torch.bool),
    )
    for edit, touched in touched_by:
        here = (layer == edit.layer) & (edit.kind in LOCAL_KINDS)
        local &= ~touched | here
        keyed |= touched & ("key_pos" in LAYOUTS[edit.kind])
    columns = (layer, start, window_end, local, keyed)
    rows = zip(*(c.tolist() for c in columns), strict=True)
    return [None if row[0] == big else Extent(*row) for row in rows]


def reaches(extent: Extent, declared: Sequence[int], n_layers: int) -> bool:
    """Whether a variant can change the logits at a declared position."""
    if extent.start > declared[-1]:
        return False
    if extent.local and extent.layer == n_layers - 1:
        return any(extent.start <= p < extent.window_end for p in declared)
    return True


def sweep(
    model: HookedTransformer,
    base: BaseRun,
    edits: Sequence[Edit],
    n_variants: int,
    metric: Metric,
    declared: Sequence[int] | None = None,
    memory_budget: int | None = None,
    labels: Sequence[str] | None = None,
) -> Float[Tensor, "variant batch"]:
    """The metric of every variant of `base` (see the module docstring). `labels` name the
    variants in errors."""
    batch, n_pos = base.tokens.shape
    n_layers = model.cfg.n_layers
    found = extents(edits, n_variants, n_pos)
    if declared is not None:
        found = [e if e is not None and reaches(e, declared, n_layers) else None for e in found]
    end = n_pos if declared is None else declared[-1] + 1
    n_unembed = None if declared is None else len(declared)
    budget = default_memory_budget(model) if memory_budget is None else memory_budget
    cost = pass_cost(model, n_pos, _time_one_pass)
    passes = plan(model, found, batch, end, n_unembed, cost, budget)
    out = base.metric.repeat(n_variants, 1)
    for p in passes:
        resid, _, last_kv = _run(model, base, edits, p, n_layers, ())
        if declared is None:
            logits = full_logits(model, base, p, resid)
            values = [metric_values(metric, variant) for variant in logits]
        else:
            logits = declared_logits(model, base, p, resid, declared)
            if p.again:
                logits = again(model, base, p, last_kv, declared, logits)
            names = (
                [f"variant {i}" for i in p.variants]
                if labels is None
                else [labels[i] for i in p.variants]
            )
            values = declared_metric(metric, logits, declared, n_pos, names, base.metric)
        out[list(p.variants)] = torch.stack(list(values))
    return out


def _time_one_pass(model: HookedTransformer, n_pos: int) -> float:
    """The best of three times of a whole pass (one variant patching the last position
    of the residual stream, its logits and metric), on `model`'s own sweep machinery."""
    tokens = torch.zeros(1, n_pos, dtype=torch.long, device=model.cfg.device)
    base = base_run(model, tokens, _first_logit, [get_act_name("resid_pre", 0)])
    where = torch.zeros(1, 1, n_pos, 1, dtype=torch.bool)
    where[..., -1, :] = True
    edits = [Edit("resid_pre", 0, where, base.cache[get_act_name("resid_pre", 0)])]
    p = Pass(0, (0,), (n_pos - 1,), n_pos - 1, 1, 1)
    best = float("inf")
    for _ in range(3):
        start = time.perf_counter()
        logits = full_logits(model, base, p, _run(model, base, edits, p, 1, ())[0])
        float(metric_values(_first_logit, logits[0])[0])  # waits for an accelerator
        best = min(best, time.perf_counter() - start)
    return best


def _first_logit(logits: Float[Tensor, "batch pos d_vocab_out"]) -> Float[Tensor, " batch"]:
    return logits[:, -1, 0]


def record(
    model: HookedTransformer,
    base: BaseRun,
    edits: Sequence[Edit],
    n_variants: int,
    names: Sequence[str],
    stop_layer: int,
    end: int,
    memory_budget: int | None = None,
) -> dict[str, Tensor]:
    """The activations at `names` of positions `..end-1` in every variant of `base`,
    `[variant batch ...]`, from passes that stop before block `stop_layer`."""
    batch = base.tokens.shape[0]
    found = extents(edits, n_variants, base.tokens.shape[1])
    budget = default_memory_budget(model) if memory_budget is None else memory_budget
    kept = sum(base.cache[n][:1].numel() for n in names)
    per_variant = batch * (end * row_floats(model, end) + kept) * base.logits.element_size()
    size = max(1, budget // per_variant)
    out: dict[str, list[Tensor]] = {n: [] for n in names}
    for i in range(0, n_variants, size):
        variants = tuple(range(i, min(i + size, n_variants)))
        first = min((found[v].layer for v in variants if found[v] is not None), default=stop_layer)
        p = Pass(first, variants, (0,) * len(variants), 0, end, end)
        recorded = _run(model, base, edits, p, stop_layer, names)[1] if first < stop_layer else {}
        for name in names:  # a hook point before the pass's first block keeps its value
            unpatched = base.cache[name][None].narrow(2, 0, end)
            out[name].append(
                recorded.get(name, unpatched.expand(len(variants), *unpatched.shape[1:]))
            )
    return {name: torch.cat(values) for name, values in out.items()}


def _run(
    model: HookedTransformer,
    base: BaseRun,
    edits: Sequence[Edit],
    p: Pass,
    stop_layer: int,
    names: Sequence[str],
) -> tuple[Float[Tensor, "sequence row d_model"], dict[str, Tensor], tuple[Tensor, Tensor]]:
    """Pass `p` from its block to block `stop_layer`: the residual stream it leaves, the
    activations at `names` (`[variant batch ...]`), and when `p.again` the last block's
    keys and values of the rows run (`[sequence row ...]`; else empty)."""
    n_variants = len(p.variants)
    variants = torch.tensor(p.variants)
    offsets = torch.tensor(p.offsets, device=base.tokens.device)
    recorded: dict[str, Tensor] = {}

    def keep(activation: Tensor, hook) -> None:
        recorded[hook.name] = rearrange(activation, "(v b) ... -> v b ...", v=n_variants)

    hooks = [h for e in edits if (h := _edit_hook(e, p, variants, offsets)) is not None]
    hooks += [(name, keep) for name in names]
    past = _past(model, base, p, offsets)
    resid = _rows_of(
        base.cache[get_act_name("resid_pre", p.layer)][None], 2, p, offsets, 0, p.first_rows
    )
    resid = rearrange(resid.expand(n_variants, -1, -1, -1), "v b row d -> (v b) row d")
    later = p.layer + 1
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        if p.first_rows == p.rows or later >= stop_layer:
            resid = model(
                resid, start_at_layer=p.layer, stop_at_layer=stop_layer, past_kv_cache=past
            )
        else:  # the first block changes a window of rows: the later blocks run more
            resid = model(resid, start_at_layer=p.layer, stop_at_layer=later, past_kv_cache=past)
            rest = _rows_of(base.cache[get_act_name("resid_pre", later)][None], 2, p, offsets,
                            p.first_rows, p.rows - p.first_rows)  # fmt: skip
            rest = rearrange(rest.expand(n_variants, -1, -1, -1), "v b row d -> (v b) row d")
            resid = torch.cat([resid, rest], dim=1)
            resid = model(resid, start_at_layer=later, stop_at_layer=stop_layer, past_kv_cache=past)
    if not p.again:
        return resid, recorded, (resid[:0], resid[:0])
    last = past[model.cfg.n_layers - 1]
    return resid, recorded, (last.past_keys[:, p.n_past :], last.past_values[:, p.n_past :])


def _rows_of(
    x: Tensor, axis: int, p: Pass, offsets: Int[Tensor, " variant"], skip: int, n_rows: int
) -> Tensor:
    """Rows `skip..skip+n_rows-1` of every variant of `p` along `axis` of `x` (whose first
    axis is the variant's, or of size 1 and shared); an axis of size 1 broadcasts."""
    size = x.shape[axis]
    if size == 1:
        return x
    if p.uniform and p.n_past + skip + n_rows <= size:
        return x.narrow(axis, p.n_past + skip, n_rows)
    index = offsets[:, None] + torch.arange(skip, skip + n_rows, device=offsets.device)
    shape = [1] * x.ndim
    shape[0], shape[axis] = len(offsets), n_rows
    # Rows past the end are padding after a shorter variant's own: never read.
    index = index.clamp(max=size - 1).to(x.device).reshape(shape)
    return torch.take_along_dim(x, index, dim=axis)


def _edit_hook(
    edit: Edit, p: Pass, variants: Tensor, offsets: Int[Tensor, " variant"]
) -> tuple[str, Callable] | None:
    """A hook applying `edit` to the variants of `p`, or None where it touches none of them."""
    mask = (edit.mask[variants] if edit.mask.shape[0] > 1 else edit.mask).to(edit.source.device)
    if not bool(mask.any()):
        return None
    source = edit.source_of(variants.to(edit.source.device))
    n_rows = p.first_rows if edit.layer == p.layer else p.rows
    layout = LAYOUTS[edit.kind]
    pos = 2 + layout.index("pos")
    mask, source = (_rows_of(x, pos, p, offsets, 0, n_rows) for x in (mask, source))
    if "key_pos" in layout:  # a pass of one offset: keys are the past ones, then the rows
        key = 2 + layout.index("key_pos")
        mask, source = (
            x if x.shape[key] == 1 else x.narrow(key, 0, p.n_past + n_rows) for x in (mask, source)
        )
    n_variants = len(p.variants)

    def patch(activation: Tensor, hook) -> Tensor:
        by_variant = rearrange(activation, "(v b) ... -> v b ...", v=n_variants)
        return rearrange(torch.where(mask, source, by_variant), "v b ... -> (v b) ...")

    return edit.hook, patch


def _past(
    model: HookedTransformer, base: BaseRun, p: Pass, offsets: Int[Tensor, " variant"]
) -> KeyValueCache | None:
    """The unpatched keys and values of positions `..p.n_past-1` in every block from
    `p.layer`, per variant, those at a variant's own offset and later masked."""
    if p.n_past == 0 and not p.again:
        return None
    n_variants, batch = len(p.variants), base.tokens.shape[0]
    entries = {}
    for layer in range(p.layer, model.cfg.n_layers):
        keys, values = (
            repeat(base.cache[name][:, : p.n_past], "b pos h d -> (v b) pos h d", v=n_variants)
            for name in (key_name(model, layer), get_act_name("v", layer))
        )
        # With `again` the last block keeps the keys and values its rows append.
        last = layer == model.cfg.n_layers - 1
        entries[layer] = KeyValueCacheEntry(keys, values, frozen=not (p.again and last))
    filled = [
        entries[max(layer, p.layer)] for layer in range(model.cfg.n_layers)
    ]  # earlier blocks do not run
    seen = torch.arange(p.n_past, device=offsets.device)[None] < offsets[:, None]
    mask = repeat(seen.long(), "v pos -> (v b) pos", b=batch)
    return KeyValueCache(filled, mask, frozen=True)
