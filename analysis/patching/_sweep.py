"""Patched variants of one forward, run together: the batched `_reference`.

A sweep is a base run and `n_variants` variants of it, each a set of region replacements
(`_edits.Edit`: in variant i, the region `mask[i]` of one activation takes `source`'s
values). `sweep` gives the metric of every variant, `record` the activations some hook
points see in each. Every step is a forward of the model's own blocks (`start_at_layer`,
`stop_at_layer`, `past_kv_cache`), so every hook point on the way fires, and hooks
attached to the model act as in any other forward (those that index positions or the
batch see a pass's own rows). Two kinds of pass:

- *packed* (`_packed`): a variant whose edits all lie after where their block mixes
  positions changes that block's output at its own positions only, so variants of one
  block with disjoint windows share one sequence.
- *planned* (`_plan`, run by `_passes`): variants stacked along the batch axis
  (`(variant batch)`), from the pass's first block and position, after the unpatched keys
  and values before it (a frozen KV cache; a hybrid's passes start at 0).

With `declared` positions (the only ones whose logits the metric reads) a pass stops at
the last of them, unembeds only them, and a variant that cannot reach them does not run;
the metric gets NaN logits elsewhere, so reading another position is caught. Other
packages reach `sweep` and `Edit` through `engine`; `docs/guide/patching.md` has the rest.
"""

from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from analysis.patching import _passes
from analysis.patching._edits import Edit, extents, reaches
from analysis.patching._inputs import BaseRun, Metric, base_run
from analysis.patching._packed import packed_blocks
from analysis.patching._plan import (
    Pass,
    check_memory_budget,
    clock,
    default_memory_budget,
    pass_cost,
    plan,
    row_floats,
    runs_from_the_start,
)
from analysis.patching._readout import Readout, again, declared_logits, pass_pieces
from hookedattn import HookedTransformer
from hookedattn.core.names import get_act_name


def sweep(
    model: HookedTransformer,
    base: BaseRun,
    edits: Sequence[Edit],
    n_variants: int,
    metric: Metric,
    declared: Sequence[int] | None = None,
    memory_budget: int | None = None,
    label: Callable[[int], str] | None = None,
) -> Float[Tensor, "variant batch"]:
    """The metric of every variant of `base` (see the module docstring). `label(i)` names
    variant i in errors."""
    batch, n_pos = base.tokens.shape
    n_layers = model.cfg.n_layers
    budget = check_memory_budget(
        default_memory_budget(model) if memory_budget is None else memory_budget
    )
    found = extents(edits, n_variants, n_pos)
    if declared is not None:
        declared = tuple(declared)
        found = [e if e is not None and reaches(e, declared, n_layers) else None for e in found]
    end = n_pos if declared is None else declared[-1] + 1
    readout = Readout(base, metric, declared, label, budget)
    out = base.metric.repeat(n_variants, 1)
    entering = packed_blocks(model, base, edits, found, end, budget, readout, out)
    n_unembed = None if declared is None else len(declared)
    cost = pass_cost(model, n_pos, _time_one_pass)
    for p in plan(model, found, batch, end, n_unembed, cost, budget):
        resid, _, last_kv = _passes.run(model, base, edits, p, n_layers, (), entering.get(p.layer))
        if declared is None:
            pieces = pass_pieces(model, p, resid, n_pos)
        else:
            logits = declared_logits(model, base, p, resid, declared)
            if p.again:
                logits = again(model, base, p, last_kv, declared, logits)
            pieces = [(list(declared), logits)]
        out[list(p.variants)] = readout.values(p.variants, pieces)
    return out


def _time_one_pass(model: HookedTransformer, n_pos: int) -> float:
    """The best of three times of a whole pass (one variant patching the stream's last
    position, its logits and metric), by `model`'s own sweep."""
    tokens = torch.zeros(1, n_pos, dtype=torch.long, device=model.cfg.device)
    base = base_run(model, tokens, _first_logit, [get_act_name("resid_pre", 0)])
    where = torch.zeros(1, 1, n_pos, 1, dtype=torch.bool)
    where[..., -1, :] = True
    edits = [Edit("resid_pre", 0, where, base.cache[get_act_name("resid_pre", 0)])]
    n_past = 0 if runs_from_the_start(model) else n_pos - 1
    p = Pass(0, (0,), n_past, n_pos - n_past)
    readout = Readout(base, _first_logit, None, None)
    best, now = float("inf"), clock(model.cfg.device)
    for _ in range(3):
        start = now()
        pieces = pass_pieces(model, p, _passes.run(model, base, edits, p, 1, ())[0], n_pos)
        float(readout.values((0,), pieces)[0, 0])  # waits for an accelerator
        best = min(best, now() - start)
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
    budget = check_memory_budget(
        default_memory_budget(model) if memory_budget is None else memory_budget
    )
    kept = sum(base.cache[n][:1].numel() for n in names)
    per_variant = batch * (end * row_floats(model.cfg, end) + kept) * base.logits.element_size()
    size = max(1, budget // per_variant)
    out: dict[str, list[Tensor]] = {n: [] for n in names}
    for i in range(0, n_variants, size):
        variants = tuple(range(i, min(i + size, n_variants)))
        first = min((found[v].layer for v in variants if found[v] is not None), default=stop_layer)
        p = Pass(first, variants, 0, end)
        recorded = (
            _passes.run(model, base, edits, p, stop_layer, names)[1] if first < stop_layer else {}
        )
        for name in names:  # a hook point before the pass's first block keeps its value
            unpatched = base.cache[name][None].narrow(2, 0, end)
            out[name].append(
                recorded.get(name, unpatched.expand(len(variants), *unpatched.shape[1:]))
            )
    return {name: torch.cat(values) for name, values in out.items()}
