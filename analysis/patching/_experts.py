"""Patching what one expert writes (`expert_out`), in the engine and in the reference.

An expert's write at a position is its output there times the router's weight, and zero
where the token did not choose it (`analysis.experts.expert_writes`). Its activations live
in rows, one per token routed to it, and the two runs route differently, so no region of
an activation can be swapped. The patch is instead defined on the MLP's output, which is
the sum of the writes: at the component's positions,

    mlp_out  <-  mlp_out - write_e(target) + write_e(source)

`reference_hooks` does exactly that inside each patched forward, from the rows, routing and
output that forward itself computes: the definition. The engine (`edits`) replaces the
target's `mlp_out` by the base run's plus the same difference, built when a pass asks for
its variants: in a sweep of single patches nothing upstream of a variant's edit changes, so
the two agree (the tests check that they do). The MLP's output must be the mixture's own
(no norm after the MLP, `ln2_post`), which holds for every imported mixture of experts.

More in `docs/guide/moe.md`.
"""

from collections.abc import Callable, Sequence

import torch
from jaxtyping import Float
from torch import Tensor

from analysis._naming import Component
from analysis.experts import expert_rows
from analysis.patching._edits import Edit
from hookedattn import ActivationCache, HookedTransformer
from hookedattn.core.components.norm import NoNorm


def check_patchable(model: HookedTransformer) -> None:
    """A `ValueError` unless each block's MLP output is its mixture's (see the docstring)."""
    if any(not isinstance(getattr(b, "ln2_post", NoNorm()), NoNorm) for b in model.blocks):
        raise ValueError(
            "patching 'expert_out' changes the mixture's output, which this model normalises "
            "after its MLP (ln2_post) before hook_mlp_out: not supported here"
        )


def hook_names(model: HookedTransformer) -> list[str]:
    """What a base run keeps for expert patching: every block's routing, experts' rows and
    MLP output."""
    out = []
    for layer in range(model.cfg.n_layers):
        mlp = f"blocks.{layer}.mlp"
        out += [f"{mlp}.hook_expert_indices", f"{mlp}.hook_expert_weights"]
        out += [f"{mlp}.experts.{e}.hook_out" for e in range(model.cfg.num_experts)]
        out.append(f"blocks.{layer}.hook_mlp_out")
    return out


def _write(
    model: HookedTransformer, cache: ActivationCache, layer: int, expert: int
) -> Float[Tensor, "batch pos d_model"]:
    rows = expert_rows(model, cache, layer, expert)
    indices = cache[f"blocks.{layer}.mlp.hook_expert_indices"]
    out = rows.outputs.new_zeros(*indices.shape[:2], model.cfg.d_model)
    out[rows.batch, rows.pos] = rows.weight[:, None] * rows.outputs
    return out


class _Deltas:
    """The target's `mlp_out` of one block with each variant's expert write swapped for the
    source's (the base run's `mlp_out` where the variant patches another block), built for
    the variants a pass asks for: what `Edit.source` holds for `expert_out` patches."""

    ndim = 4  # [variant batch pos d_model]: one source per variant

    def __init__(
        self,
        model: HookedTransformer,
        layer: int,
        experts: Sequence[int | None],
        source: ActivationCache,
        target: ActivationCache,
    ) -> None:
        self.model, self.layer, self.experts = model, layer, list(experts)
        self.source, self.target = source, target
        self.base = target[f"blocks.{layer}.hook_mlp_out"]
        self.device = self.base.device

    def __getitem__(self, variants: Tensor | Sequence[int]) -> Float[Tensor, "v batch pos d"]:
        variants = torch.as_tensor(variants).reshape(-1).tolist()
        out = self.base[None].repeat(len(variants), 1, 1, 1)
        differences: dict[int, Tensor] = {}
        for i, v in enumerate(variants):
            e = self.experts[v]
            if e is None:
                continue
            if e not in differences:
                differences[e] = _write(self.model, self.source, self.layer, e) - _write(
                    self.model, self.target, self.layer, e
                )
            out[i] += differences[e]
        return out


def edits(
    model: HookedTransformer,
    components: Sequence[Component],
    source: ActivationCache,
    target: ActivationCache,
) -> list[Edit]:
    """One `mlp_out` edit per block the components patch: variant i, at its component's
    positions, takes the target's MLP output with its expert's write the source's."""
    check_patchable(model)
    n_pos = target["blocks.0.hook_mlp_out"].shape[1]
    out = []
    for layer in sorted({c.layer for c in components}):
        mask = torch.zeros(len(components), 1, n_pos, 1, dtype=torch.bool)
        experts: list[int | None] = []
        for i, c in enumerate(components):
            here = c.layer == layer
            experts.append(c.expert if here else None)
            if here:
                mask[i, 0, slice(None) if c.pos is None else c.pos] = True
        deltas = _Deltas(model, layer, experts, source, target)
        out.append(Edit("mlp_out", layer, mask.to(deltas.device), deltas))
    return out


def reference_hooks(
    model: HookedTransformer, component: Component, source: ActivationCache
) -> list[tuple[str, Callable]]:
    """Hooks that patch `component` in one forward, from that forward's own routing and
    rows: the definition of an `expert_out` patch."""
    check_patchable(model)
    layer, e = component.layer, component.expert
    mlp = f"blocks.{layer}.mlp"
    seen: dict[str, Tensor] = {}
    keep = lambda t, hook: seen.__setitem__(hook.name, t)
    mine = [f"{mlp}.hook_expert_{part}" for part in ("indices", "weights")]
    mine.append(f"{mlp}.experts.{e}.hook_out")
    theirs = _write(model, source, layer, e)
    where = slice(None) if component.pos is None else component.pos

    def patch(mlp_out: Tensor, hook) -> Tensor:
        this = _write(model, ActivationCache(dict(seen), model.cfg.n_layers), layer, e)
        patched = mlp_out.clone()
        patched[:, where] += theirs[:, where] - this[:, where]
        return patched

    return [*((name, keep) for name in mine), (f"blocks.{layer}.hook_mlp_out", patch)]
