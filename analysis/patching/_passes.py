"""One pass of a sweep: variants stacked along the batch axis (`(variant batch)`) run
through the model's own blocks from a pass's first block and position (`run`), after the
unpatched keys and values before it (a frozen KV cache), each variant's edits applied by a
hook at its hook point. The stream entering the first block is the unpatched run's, or,
after a packed block (`_packed`), each variant's from its pack (`Entering`).
"""

import dataclasses
from collections.abc import Callable, Sequence

import torch
from einops import rearrange, repeat
from jaxtyping import Bool, Float, Int
from torch import Tensor

from analysis.patching._components import LAYOUTS
from analysis.patching._edits import Edit
from analysis.patching._inputs import BaseRun, key_name, value_name
from analysis.patching._plan import (
    Pass,
)
from hookedattn import HookedTransformer
from hookedattn.core.kv_cache import KeyValueCache, KeyValueCacheEntry
from hookedattn.core.names import get_act_name


@dataclasses.dataclass(frozen=True)
class Entering:
    """The residual stream entering a block for variants that a packed pass ran through
    the block before: a variant's window (`window[v]`) from its pack `pack_of[v]`, the
    unpatched stream elsewhere."""

    packs: Float[Tensor, "pack batch pos d_model"]
    pack_of: Int[Tensor, " variant"]
    window: Bool[Tensor, "variant pos"]

    def of(
        self, variants: Sequence[int], unpatched: Float[Tensor, "1 batch row d_model"], p: Pass
    ) -> Float[Tensor, "variant batch row d_model"]:
        """The stream of `variants` at the rows `p` runs (`unpatched` holds those rows)."""
        index = torch.tensor(variants, device=self.packs.device)
        window = self.window.narrow(1, p.n_past, p.rows)[index][:, None, :, None]
        packs = self.packs.narrow(2, p.n_past, p.rows)[self.pack_of[index]]
        return torch.where(window, packs, unpatched)


def run(
    model: HookedTransformer,
    base: BaseRun,
    edits: Sequence[Edit],
    p: Pass,
    stop_layer: int,
    names: Sequence[str],
    entering: Entering | None = None,
) -> tuple[Float[Tensor, "sequence row d_model"], dict[str, Tensor], tuple[Tensor, Tensor]]:
    """Pass `p` from its block to block `stop_layer`: the stream it leaves, the activations
    at `names` (`[variant batch ...]`), with `p.again` the last block's keys and values of
    its rows (`[sequence row ...]`; else empty). The stream entering it is the unpatched
    run's, or `entering`'s."""
    n_variants = len(p.variants)
    variants = torch.tensor(p.variants)
    recorded: dict[str, Tensor] = {}

    def keep(activation: Tensor, hook) -> None:
        recorded[hook.name] = rearrange(activation, "(v b) ... -> v b ...", v=n_variants)

    hooks = [h for e in edits if (h := _edit_hook(e, p, variants)) is not None]
    # With `again`, the last block's keys and values of the rows, as its hook points see
    # them (after any edit; whole under tensor parallelism, where the cache holds a slice).
    last_kv = _last_kv_names(model) if p.again else ()
    hooks += [(name, keep) for name in (*names, *last_kv)]
    past = _past(model, base, p, stop_layer)
    resid = _rows_of(base.cache[get_act_name("resid_pre", p.layer)][None], 2, p)
    if entering is not None:
        resid = entering.of(p.variants, resid, p)
    resid = rearrange(resid.expand(n_variants, -1, -1, -1), "v b row d -> (v b) row d")
    # A view of some rows would make every projection a broadcast batched matmul.
    resid = resid.contiguous()
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        resid = model(resid, start_at_layer=p.layer, stop_at_layer=stop_layer, past_kv_cache=past)
    if not p.again:
        return resid, recorded, (resid[:0], resid[:0])
    keys, values = (
        rearrange(recorded.pop(name), "v b row h d -> (v b) row h d") for name in last_kv
    )
    return resid, recorded, (keys, values)


def _last_kv_names(model: HookedTransformer) -> tuple[str, str]:
    """The hook points whose values the last block's KV cache holds."""
    last = model.cfg.n_layers - 1
    return key_name(model, last), value_name(model, last)


def _rows_of(x: Tensor, axis: int, p: Pass) -> Tensor:
    """The rows `p` runs along `axis` of `x`; an axis of size 1 broadcasts."""
    return x if x.shape[axis] == 1 else x.narrow(axis, p.n_past, p.rows)


def _edit_hook(edit: Edit, p: Pass, variants: Tensor) -> tuple[str, Callable] | None:
    """A hook applying `edit` to the variants of `p`, or None where it touches none of them
    (or lies in a block before the pass's first)."""
    if edit.layer < p.layer:
        return None
    mask = (edit.mask[variants] if edit.mask.shape[0] > 1 else edit.mask).to(edit.source.device)
    if not bool(mask.any()):
        return None
    source = edit.source_of(variants.to(edit.source.device))
    layout = LAYOUTS[edit.kind]
    pos = 2 + layout.index("pos")
    mask, source = (_rows_of(x, pos, p) for x in (mask, source))
    if "key_pos" in layout:  # keys are the past ones, then the rows
        key = 2 + layout.index("key_pos")
        mask, source = (
            x if x.shape[key] == 1 else x.narrow(key, 0, p.n_past + p.rows) for x in (mask, source)
        )
    n_variants = len(p.variants)

    def patch(activation: Tensor, hook) -> Tensor:
        by_variant = rearrange(activation, "(v b) ... -> v b ...", v=n_variants)
        return rearrange(torch.where(mask, source, by_variant), "v b ... -> (v b) ...")

    return edit.hook, patch


def _past(
    model: HookedTransformer,
    base: BaseRun,
    p: Pass,
    stop_layer: int,
) -> KeyValueCache | None:
    """The unpatched keys and values of positions `..p.n_past-1` in the blocks `p` runs,
    for every sequence of the pass."""
    if p.n_past == 0:
        return None
    n_variants, batch = len(p.variants), base.tokens.shape[0]
    entries = {}
    for layer in range(p.layer, stop_layer):
        keys, values = (
            repeat(base.cache[name][:, : p.n_past], "b pos h d -> (v b) pos h d", v=n_variants)
            for name in (key_name(model, layer), value_name(model, layer))
        )
        entries[layer] = KeyValueCacheEntry(keys, values, frozen=True)
    # Blocks the pass does not run take any entry: they never read it.
    filled = [
        entries[min(max(layer, p.layer), stop_layer - 1)] for layer in range(model.cfg.n_layers)
    ]
    mask = torch.ones(n_variants * batch, p.n_past, dtype=torch.long, device=base.tokens.device)
    return KeyValueCache(filled, mask, frozen=True)
