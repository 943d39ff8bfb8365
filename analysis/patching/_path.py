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
its corrupted value. Each step stacks the senders along the batch axis. In a hybrid model a
mixer in attention's place moves information between positions as heads do, so step 1
freezes its write (`attn_out` of its block) as it freezes the heads'; a mixer beside the
attention (Falcon-H1's) has no write of its own to patch, and is refused.

More in `docs/guide/patching.md`.
"""

from collections.abc import Sequence

import torch
from jaxtyping import Bool
from torch import Tensor

from analysis.patching._components import (
    Component,
    check_component,
    component_grid,
    component_masks,
    refuse_unsupported,
)
from analysis.patching._edits import Edit, component_edits
from analysis.patching._inputs import BaseRun, Metric, base_runs, check_direction, paired_tokens
from analysis.patching._sweep import record, sweep
from analysis.patching.result import PatchingResult
from hookedattn import HookedTransformer
from hookedattn.core.names import get_act_name

HEAD_WRITES = ("z", "result")  # kinds whose edit is a head's own output


def path_patch(
    model: HookedTransformer,
    receivers: Component | Sequence[Component],
    senders: str | Sequence[Component] = "z",
    *,
    # [batch pos] token ids, loosely annotated so that a mismatch (a cache passed in
    # TransformerLens's order, a wrong dtype or shape) gets our own message.
    clean_tokens: object,
    corrupted_tokens: object,
    metric: Metric,
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
    the last receiver's block. The numbers are those of the full computation.
    """
    check_direction(direction)
    n_pos = paired_tokens(model, clean_tokens, corrupted_tokens)[0].shape[1]
    receivers = _checked_receivers(model, receivers, n_pos)
    sender_list, axes, labels, kind = _senders(model, senders, n_pos)
    hooks = {c.hook_name for c in [*sender_list, *receivers]}
    hooks |= {get_act_name("z", layer) for layer in model.cfg.attention_layers}
    hooks |= {get_act_name("attn_out", layer) for layer in _mixer_layers(model)}
    if freeze_mlps:
        hooks |= {get_act_name("mlp_out", layer) for layer in _mlp_layers(model)}
    runs = base_runs(model, clean_tokens, corrupted_tokens, metric, sorted(hooks), metric_positions)
    noising = direction == "noising"
    base, other = (runs.clean, runs.corrupted) if noising else (runs.corrupted, runs.clean)
    declared, n_senders = runs.declared, len(sender_list)
    end = n_pos if declared is None else declared[-1] + 1
    edits = _step_one_edits(model, base, other, sender_list, receivers, freeze_mlps)
    names = list(dict.fromkeys(r.hook_name for r in receivers))
    stop = model.cfg.n_layers if declared is None else max(r.layer for r in receivers) + 1
    recorded = record(model, base, edits, n_senders, names, stop, end, memory_budget)
    edits = [_receiver_edit(receivers, hook, values) for hook, values in recorded.items()]
    per_prompt = sweep(
        model, base, edits, n_senders, metric, declared, memory_budget,
        lambda i: sender_list[i].label(),
    )  # fmt: skip
    per_prompt = per_prompt.reshape(*(len(t) for t in labels), -1)
    name = f"{kind} -> {', '.join(r.label() for r in receivers)}"
    return PatchingResult(
        "path patching", direction, name, axes, labels, per_prompt, runs.clean.metric,
        runs.corrupted.metric,
    )  # fmt: skip


def _checked_receivers(
    model: HookedTransformer, receivers: Component | Sequence[Component], n_pos: int
) -> list[Component]:
    receivers = [receivers] if isinstance(receivers, Component) else list(receivers)
    if not receivers:
        raise ValueError("give at least one receiver, e.g. Component('k', 1, head=0)")
    for r in receivers:
        refuse_unsupported(getattr(r, "name", None), "path patching")
    return [check_component(model, r, n_pos) for r in receivers]


def _senders(
    model: HookedTransformer, senders: str | Sequence[Component], n_pos: int
) -> tuple[list[Component], tuple[str, ...], tuple[tuple[str, ...], ...], str]:
    """The senders, and the axes, tick labels and kind of the result."""
    if isinstance(senders, str):
        refuse_unsupported(senders, "path patching")
        grid = component_grid(model, senders, n_pos, by_pos=False)
        return list(grid.components), grid.axes, grid.labels, senders
    for s in senders:
        refuse_unsupported(getattr(s, "name", None), "path patching")
    sender_list = [check_component(model, s, n_pos) for s in senders]
    if not sender_list:
        raise ValueError("give at least one sender, or a kind such as 'z'")
    return sender_list, ("sender",), (tuple(s.label() for s in sender_list),), "senders"


def _step_one_edits(
    model: HookedTransformer,
    base: BaseRun,
    other: BaseRun,
    senders: Sequence[Component],
    receivers: Sequence[Component],
    freeze_mlps: bool,
) -> list[Edit]:
    """Step 1: per sender, the sender from the other run and, from its block on, every
    other head's output (and with `freeze_mlps` every MLP's) frozen at the base run's."""
    model.cfg.require_one_attention_shape("path patching")
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    free = _unfrozen_heads(senders, receivers, n_layers, n_heads)
    after = torch.tensor([[layer >= s.layer for layer in range(n_layers)] for s in senders])
    edits = []
    for layer in model.cfg.attention_layers:
        z = get_act_name("z", layer)
        frozen = ~free[:, layer] & after[:, layer, None]
        edits.append(
            Edit("z", layer, frozen.reshape(len(senders), 1, 1, n_heads, 1), base.cache[z])
        )
    for layer in _mixer_layers(model):  # a hybrid's mixer, frozen as a head is
        edits.append(_frozen_write("attn_out", base, senders, receivers, layer, after[:, layer]))
    for layer in _mlp_layers(model) if freeze_mlps else ():
        edits.append(_frozen_write("mlp_out", base, senders, receivers, layer, after[:, layer]))
    return edits + component_edits(senders, other.cache)


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


def _frozen_write(
    kind: str,
    base: BaseRun,
    senders: Sequence[Component],
    receivers: Sequence[Component],
    layer: int,
    after: Bool[Tensor, " variant"],
) -> Edit:
    """Freeze this layer's sublayer output `kind` (`mlp_out`, a mixer's `attn_out`) from
    each sender's block on, except where it is the sender or a receiver."""
    name = get_act_name(kind, layer)
    receives = any(r.hook_name == name for r in receivers)
    frozen = torch.tensor([not receives and s.hook_name != name for s in senders]) & after
    return Edit(kind, layer, frozen.reshape(-1, 1, 1, 1), base.cache[name])


def _mlp_layers(model: HookedTransformer) -> list[int]:
    """The blocks holding an MLP."""
    return [layer for layer in range(model.cfg.n_layers) if model.cfg.layer_has_mlp(layer)]


def _mixer_layers(model: HookedTransformer) -> list[int]:
    """The blocks holding a mixer in attention's place; a `ValueError` for a model with a
    mixer beside its attention (module docstring)."""
    mixers = model.cfg.mixers
    if mixers is not None and mixers.beside_attention is not None:
        raise ValueError(
            f"path patching freezes every sublayer that moves information between "
            f"positions; this model's {mixers.beside_attention!r} mixers sit beside its "
            f"attention and write with it (blocks.L.hook_mixer_out), with no component "
            f"of their own to freeze"
        )
    return [layer for layer in range(model.cfg.n_layers)
            if model.cfg.layer_mixer(layer) not in ("attention", "none")]  # fmt: skip


def _receiver_edit(receivers: Sequence[Component], hook: str, values: Tensor) -> Edit:
    """Step 2: the receivers at `hook` take each sender's recorded activation."""
    here = [r for r in receivers if r.hook_name == hook]
    where = component_masks(here, hook, values.shape[2:]).any(dim=0, keepdim=True)
    return Edit(here[0].name, here[0].layer, where, values)
