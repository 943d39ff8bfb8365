"""Path patching (Wang et al. 2022, "Interpretability in the Wild", section 3.1 and
appendix B): the effect of a sender on the output through chosen receivers only.

In the noising direction, for each sender:

1. run the clean prompts with the sender's activation taken from the corrupted run and
   every other head's output (`z`) frozen at its clean value, and record what the
   receivers (e.g. head 1.0's keys, `Component("k", 1, head=0)`) see;
2. run the clean prompts again with only the receivers' activations replaced by those
   recordings, and measure.

Freezing the other heads cuts every path from the sender that passes through another
head on its way to a receiver, so what remains is the sender's direct effect on the
receivers' input, carried on to the output by the unfrozen model. MLPs recompute unless
`freeze_mlps=True` (the IOI paper treats them as part of the direct path). Denoising is
the mirror image: corrupted prompts, the sender from the clean run, the rest frozen at
its corrupted value. Each step stacks the senders along the batch axis.
"""

from collections.abc import Sequence

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from analysis.patching.components import (
    Component,
    check_component,
    component_grid,
    component_masks,
)
from analysis.patching.declared import (
    check_metric_reads,
    declared_metric,
    declared_positions,
    pass_shape,
    run_declared,
)
from analysis.patching.engine import (
    BaseRun,
    Edit,
    _by_variant,
    _edit_hook,
    _rows,
    base_run,
    bytes_per_sequence,
    default_memory_budget,
    run_variants,
)
from analysis.patching.inputs import Metric, metric_values, paired_tokens
from analysis.patching.result import PatchingResult
from hookedattn import HookedTransformer
from hookedattn.names import get_act_name

HEAD_WRITES = ("z", "result")  # kinds whose edit is a head's own output


def path_patch(
    model: HookedTransformer,
    clean_tokens: Tensor,
    corrupted_tokens: Tensor,
    metric: Metric,
    receivers: Component | Sequence[Component],
    senders: str | Sequence[Component] = "z",
    *,
    direction: str = "noising",
    freeze_mlps: bool = False,
    memory_budget: int | None = None,
    # An int or a sequence of ints, loosely annotated so that bad input gets our message.
    metric_positions: object = None,
) -> PatchingResult:
    """The metric with each sender's path to `receivers` patched (see the module docstring).

    `senders` is a kind (`"z"`: every head, a `[layer head]` result) or a list of
    `Component`s (a `[sender]` result). `receivers` is one `Component` or several, e.g.
    `Component("k", 1, head=0)` for head 1.0's keys, or `Component("resid_post", n - 1)`
    for the direct path to the logits. `metric` maps logits to one value per prompt.

    `metric_positions` (e.g. `-1`) declares the positions whose logits the metric reads,
    as in `activation_patch`: both steps then stop at the last of them, the first after
    the last receiver's block, and the second runs the last block's queries and the
    unembedding at those positions only. The numbers are those of the full computation.
    """
    clean_tokens, corrupted_tokens = paired_tokens(model, clean_tokens, corrupted_tokens)
    if direction not in ("denoising", "noising"):
        raise ValueError(f"direction must be 'denoising' or 'noising', got {direction!r}")
    n_pos = clean_tokens.shape[1]
    receivers = [receivers] if isinstance(receivers, Component) else list(receivers)
    if not receivers:
        raise ValueError("give at least one receiver, e.g. Component('k', 1, head=0)")
    for receiver in receivers:
        check_component(model, receiver, n_pos)
    if isinstance(senders, str):
        grid = component_grid(model, senders, n_pos, by_pos=False)
        sender_list, axes, labels, kind = list(grid.components), grid.axes, grid.labels, senders
    else:
        sender_list = [check_component(model, s, n_pos) for s in senders]
        if not sender_list:
            raise ValueError("give at least one sender, or a kind such as 'z'")
        axes, labels, kind = ("sender",), (tuple(s.label() for s in sender_list),), "senders"
    hooks = {c.hook_name for c in [*sender_list, *receivers]}
    hooks |= {get_act_name("z", layer) for layer in range(model.cfg.n_layers)}
    if freeze_mlps:
        hooks |= {get_act_name("mlp_out", layer) for layer in range(model.cfg.n_layers)}
    clean = base_run(model, clean_tokens, metric, sorted(hooks))
    corrupted = base_run(model, corrupted_tokens, metric, sorted(hooks))
    declared = None
    if metric_positions is not None:
        declared = declared_positions(metric_positions, n_pos)
        for run in (clean, corrupted):
            check_metric_reads(metric, run, declared, metric_positions)
    base, other = (clean, corrupted) if direction == "noising" else (corrupted, clean)
    budget = default_memory_budget(model) if memory_budget is None else memory_budget
    per_variant = _bytes_per_variant(model, base, receivers)
    size = max(1, budget // per_variant)
    rows = []
    for start in range(0, len(sender_list), size):
        chunk = sender_list[start : start + size]
        recorded = _receiver_inputs(model, base, other, chunk, receivers, freeze_mlps, declared)
        rows.append(_through_receivers(model, base, receivers, recorded, chunk, metric, declared))
    per_prompt = torch.cat(rows).reshape(*(len(t) for t in labels), -1)
    name = f"{kind} -> {', '.join(r.label() for r in receivers)}"
    return PatchingResult(
        "path patching", direction, name, axes, labels, per_prompt, clean.metric, corrupted.metric
    )


def _receiver_inputs(
    model: HookedTransformer,
    base: BaseRun,
    other: BaseRun,
    senders: Sequence[Component],
    receivers: Sequence[Component],
    freeze_mlps: bool,
    declared: Sequence[int] | None,
) -> dict[str, Tensor]:
    """Step 1: the receivers' activations, per sender, with everything else frozen (with
    `declared` positions, only up to the last of them)."""
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    start = min(s.layer for s in senders)
    free = _unfrozen_heads(senders, receivers, n_layers, n_heads)
    edits = []
    for layer in range(start, n_layers):
        z = get_act_name("z", layer)
        frozen = ~free[:, layer].reshape(len(senders), 1, 1, n_heads, 1)
        edits.append(Edit(z, frozen, base.cache[z]))
        if freeze_mlps:
            edits.append(_frozen_mlp(base, senders, receivers, layer))
    for hook in dict.fromkeys(s.hook_name for s in senders):
        source = other.cache[hook]
        edits.append(Edit(hook, component_masks(senders, hook, source.shape[1:]), source))
    record = list(dict.fromkeys(r.hook_name for r in receivers))
    if declared is None:
        return run_variants(model, base, len(senders), edits, start, record=record).recorded
    stop = max(r.layer for r in receivers) + 1
    return _record(model, base, len(senders), edits, start, stop, declared[-1] + 1, record)


def _record(
    model: HookedTransformer,
    base: BaseRun,
    n_variants: int,
    edits: Sequence[Edit],
    start_layer: int,
    stop_layer: int,
    end: int,
    record: Sequence[str],
) -> dict[str, Tensor]:
    """The activations at `record`, per variant, of positions `..end-1` of a pass from
    block `start_layer` to `stop_layer` (a receiver's activation at a later position, or
    after its block, never reaches the declared positions)."""
    recorded: dict[str, Tensor] = {}

    def keep(activation: Tensor, hook) -> None:
        recorded[hook.name] = _by_variant(activation, n_variants)

    hooks = [(e.hook, _edit_hook(e, n_variants, 0, end)) for e in edits]
    hooks += [(name, keep) for name in record]
    resid = _rows(base, start_layer, 0, end, n_variants)
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        model(resid, start_at_layer=start_layer, stop_at_layer=stop_layer)
    return recorded


def _unfrozen_heads(
    senders: Sequence[Component], receivers: Sequence[Component], n_layers: int, n_heads: int
) -> Bool[Tensor, "variant layer head"]:
    """Per sender: the heads whose output is not frozen, the sender's and receivers' own."""
    free = torch.zeros(len(senders), n_layers, n_heads, dtype=torch.bool)
    for i, sender in enumerate(senders):
        for c in (sender, *receivers):
            if c.name in HEAD_WRITES:
                free[i, c.layer, slice(None) if c.head is None else c.head] = True
    return free


def _frozen_mlp(
    base: BaseRun, senders: Sequence[Component], receivers: Sequence[Component], layer: int
) -> Edit:
    """Freeze this layer's MLP output, except where it is the sender or a receiver."""
    mlp = get_act_name("mlp_out", layer)
    receives = any(r.hook_name == mlp for r in receivers)
    frozen = [not receives and s.hook_name != mlp for s in senders]
    return Edit(mlp, torch.tensor(frozen).reshape(-1, 1, 1, 1), base.cache[mlp])


def _through_receivers(
    model: HookedTransformer,
    base: BaseRun,
    receivers: Sequence[Component],
    recorded: dict[str, Tensor],
    senders: Sequence[Component],
    metric: Metric,
    declared: Sequence[int] | None,
) -> Float[Tensor, "variant batch"]:
    """Step 2: the base run with only the receivers' activations replaced."""
    edits = []
    for hook, values in recorded.items():
        here = [r for r in receivers if r.hook_name == hook]
        where = component_masks(here, hook, values.shape[2:]).any(dim=0, keepdim=True)
        edits.append(Edit(hook, where, values))
    n_variants = len(senders)
    if declared is not None:
        shape = pass_shape(model.cfg.n_layers, receivers, declared)
        logits = run_declared(model, base, n_variants, edits, shape, declared)
        labels = [s.label() for s in senders]
        n_pos = base.tokens.shape[1]
        return declared_metric(metric, logits, declared, n_pos, labels, base.metric)
    start = min(r.layer for r in receivers)
    logits = run_variants(model, base, n_variants, edits, start).logits
    return torch.stack([metric_values(metric, variant) for variant in logits])


def _bytes_per_variant(
    model: HookedTransformer, base: BaseRun, receivers: Sequence[Component]
) -> int:
    batch, n_pos = base.tokens.shape
    recorded = {r.hook_name: base.cache[r.hook_name] for r in receivers}
    kept = sum(t.numel() * t.element_size() for t in recorded.values())
    return batch * bytes_per_sequence(model, n_pos, n_pos) + kept
