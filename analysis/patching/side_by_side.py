"""Patched variants side by side along the position axis, sharing the unpatched keys.

The declared-positions passes of `declared.py` stack variants along the batch axis, so
each variant carries its own copy of the earlier keys and values (a frozen KV cache). When
a variant changes only a few rows (a patch at position p in the last block, or one
downstream of where the block before it mixes positions), copying those keys is most of
its pass. Here the rows of many variants go side by side along the position axis of one
run per prompt, after the unpatched keys and values of every position up to the last
declared one (a KV cache shared by all variants), and a mask added at each block's
`hook_attn_scores` lets each row see what it would see in a run of its own: the
unpatched keys of earlier positions, except where its variant runs a row of its own, and
its variant's earlier rows. The numbers are those of one run per variant, up to the
order of floating-point sums.

A variant's rows are its patched position p and the declared positions after it (whose
queries see the keys the patch changed), or only p for a local patch in the last block.
Some passes cannot go this way and are stacked along the batch axis instead: a rotary
model reads each row's position, which here is not its place in the run; a patch of
attention scores or a pattern has a key axis that would need the same rearranging; a
patch whose change spreads past its own row before the last block would need many rows
per variant; and the rows must fit in the model's context after the shared keys.
"""

from collections.abc import Callable, Sequence

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from analysis.patching.components import LAYOUTS, LOCAL_KINDS, Component
from analysis.patching.engine import BaseRun, Edit, _key_name, itemsize, row_floats
from hookedattn import HookedTransformer, KeyValueCache, KeyValueCacheEntry
from hookedattn.names import get_act_name


def variant_rows(component: Component, declared: Sequence[int], n_layers: int) -> list[int]:
    """The positions a variant patching `component` runs (see the module docstring)."""
    assert component.pos is not None
    if component.layer == n_layers - 1 and component.name in LOCAL_KINDS:
        return [component.pos]
    return [component.pos, *(p for p in declared if p > component.pos)]


def eligible(model: HookedTransformer, component: Component, declared: Sequence[int]) -> bool:
    """Whether a patch of `component` can run side by side with others."""
    cfg = model.cfg
    last = cfg.n_layers - 1
    room = cfg.n_ctx - (declared[-1] + 1)
    return (
        cfg.positional_embedding_type != "rotary"
        and component.pos is not None
        and "key_pos" not in LAYOUTS[component.name]
        and (
            component.layer == last
            or (component.layer == last - 1 and component.name in LOCAL_KINDS)
        )
        and len(variant_rows(component, declared, cfg.n_layers)) <= room
    )


# Rows one pass runs per prompt, at most. Each row's scores span the shared keys and every
# row of the pass, so past a point rows cost more than passes; measured on the shipped
# 2-layer model (16 to 128 tried, with 8 prompts of 64 tokens and 4 of 16: 64 was best).
_MAX_ROWS = 64


def plan_side_by_side(
    model: HookedTransformer,
    components: Sequence[Component],
    indices: Sequence[int],
    batch: int,
    declared: Sequence[int],
    memory_budget: int,
) -> list[list[int]]:
    """`indices` of eligible `components`, packed into passes of one layer each that fit
    the model's context and `memory_budget` bytes."""
    cfg = model.cfg
    n_past = declared[-1] + 1
    room = min(cfg.n_ctx - n_past, _MAX_ROWS)
    order = sorted(indices, key=lambda i: (components[i].layer, components[i].pos))
    chunks: list[list[int]] = []
    n_rows = 0
    for i in order:
        rows = len(variant_rows(components[i], declared, cfg.n_layers))
        if chunks and components[chunks[-1][0]].layer == components[i].layer:
            layer = components[i].layer
            fits = n_rows + rows <= room
            size = bytes_per_pass(model, layer, batch, n_past, n_rows + rows, len(declared))
            if fits and size <= memory_budget:
                chunks[-1].append(i)
                n_rows += rows
                continue
        chunks.append([i])
        n_rows = rows
    return chunks


def bytes_per_pass(
    model: HookedTransformer, layer: int, batch: int, n_past: int, n_rows: int, n_declared: int
) -> int:
    """Estimated peak bytes of a pass of `n_rows` rows per prompt from block `layer`: the
    rows, each block's keys and values, the mask, and the logits of every variant."""
    cfg = model.cfg
    n_keys = n_past + n_rows
    blocks = cfg.n_layers - layer
    kv = blocks * 2 * cfg.n_heads * cfg.d_head * n_keys
    per_prompt = n_rows * row_floats(model, n_keys) + kv + n_rows * cfg.d_vocab_out
    logits = n_rows * n_declared * cfg.d_vocab_out
    return itemsize(model) * (batch * (per_prompt + logits) + n_rows * n_keys)


def run_side_by_side(
    model: HookedTransformer,
    base: BaseRun,
    chosen: Sequence[Component],
    edits: Sequence[Edit],
    declared: Sequence[int],
) -> Float[Tensor, "variant batch declared d_vocab_out"]:
    """The logits at the declared positions with each of `chosen` patched by `edits`."""
    n_layers, layer = model.cfg.n_layers, chosen[0].layer
    n_past = declared[-1] + 1
    rows = [(v, p) for v, c in enumerate(chosen) for p in variant_rows(c, declared, n_layers)]
    device = base.tokens.device
    row_variant = torch.tensor([v for v, _ in rows], device=device)
    row_pos = torch.tensor([p for _, p in rows], device=device)
    seen = _visibility(row_variant, row_pos, n_past, len(chosen))
    blocked = torch.zeros(seen.shape, dtype=model.cfg.dtype, device=device)
    blocked.masked_fill_(~seen, -torch.inf)

    def mask(scores: Tensor, hook) -> Tensor:
        return scores + blocked

    hooks = [(e.hook, _gathered_edit(e, row_variant, row_pos)) for e in edits]
    hooks += [(get_act_name("attn_scores", b), mask) for b in range(layer, n_layers)]
    entries = {
        b: KeyValueCacheEntry(
            base.cache[_key_name(model, b)][:, :n_past],
            base.cache[get_act_name("v", b)][:, :n_past],
            frozen=True,
        )
        for b in range(layer, n_layers)
    }
    filled = [entries[max(b, layer)] for b in range(n_layers)]  # earlier blocks do not run
    past = KeyValueCache(filled, base.tokens.new_ones(base.tokens.shape[0], n_past), frozen=True)
    resid = base.cache[get_act_name("resid_pre", layer)][:, row_pos]
    column = {p: i for i, p in enumerate(declared)}
    logits = base.logits[:, list(declared)].repeat(len(chosen), 1, 1, 1)
    wanted = [i for i, (_, p) in enumerate(rows) if p in column]
    # Unembedding every row costs less than a second call while most rows are wanted.
    unembed_all = 2 * len(wanted) >= len(rows)
    with torch.no_grad():
        with model.hooks(fwd_hooks=hooks):
            out = model(
                resid,
                start_at_layer=layer,
                stop_at_layer=None if unembed_all else n_layers,
                past_kv_cache=past,
            )
        out = out[:, wanted] if unembed_all else model(out[:, wanted], start_at_layer=n_layers)
    columns = [column[rows[i][1]] for i in wanted]
    logits[row_variant[wanted], :, columns] = out.movedim(1, 0)
    return logits


def _visibility(
    row_variant: Int[Tensor, " row"], row_pos: Int[Tensor, " row"], n_past: int, n_variants: int
) -> Bool[Tensor, "row key"]:
    """Which keys each row may read: first the `n_past` shared ones, then every row.

    A row at position q of variant v reads the shared keys of positions up to q where v
    runs no row of its own, and v's own rows up to q (itself included).
    """
    own = torch.zeros(n_variants, n_past, dtype=torch.bool, device=row_pos.device)
    own[row_variant, row_pos] = True
    positions = torch.arange(n_past, device=row_pos.device)
    shared = (positions[None, :] <= row_pos[:, None]) & ~own[row_variant]
    same = (row_variant[:, None] == row_variant[None, :]) & (row_pos[None, :] <= row_pos[:, None])
    return torch.cat([shared, same], dim=1)


def _gathered_edit(
    edit: Edit, row_variant: Int[Tensor, " row"], row_pos: Int[Tensor, " row"]
) -> Callable:
    """A hook applying `edit` to rows laid out side by side: row r is variant
    `row_variant[r]` at position `row_pos[r]` (position is the first axis after batch)."""
    mask = edit.mask.to(row_pos.device)
    at = row_pos if mask.shape[2] > 1 else torch.zeros_like(row_pos)
    mask = mask[row_variant, 0, at][None]  # [1 row ...]
    if edit.source.ndim == mask.ndim + 1:  # one source per variant: [variant batch pos ...]
        source = edit.source[row_variant, :, row_pos].movedim(0, 1)
    else:
        source = edit.source[:, row_pos]

    def patch(activation: Tensor, hook) -> Tensor:
        return torch.where(mask, source, activation)

    return patch
