"""What can be patched: components (an activation in one layer, one head, one position).

A *kind* is a short hook name (`"resid_pre"`, `"z"`, `"pattern"`, ...). A `Component`
(`analysis._naming`) is one kind in one layer, optionally narrowed to one head and one
position. Patching a
component replaces that region of the activation and nothing else, so a sweep over every
component of a kind is a list of `Component`s, and a batched sweep is a stack of their
masks (`component_masks`), one row per patched variant.

Each head's output is patched at `z` (`[batch pos head d_head]`): the attention write
`sum_h z_h @ W_O[h]` is linear, so replacing `z_h` replaces head h's output exactly, and
`z` exists in every model (`result` only with `use_attn_result`).

In a mixture of experts the router's logits (`router_logits`: one token's, or one logit
with `expert=`), its choices (`expert_indices`: the source's experts for that token, with
the target's own weights for them) and the shared expert's output (`shared_out`) are
activations like the others. What one expert writes (`expert_out`, `[layer expert]` or
`[layer pos expert]`) is not: it lives in the rows of the tokens routed to it, which differ
between the runs. Patching it replaces, at the component's positions, the target's write
of that expert (zero where the token did not choose it) by the source's (zero likewise):
the MLP's output changes by the difference of the two (`analysis.patching._experts`).
"""

import dataclasses
import difflib
import functools
import itertools
from collections.abc import Sequence

import torch
from einops import rearrange
from jaxtyping import Bool
from torch import Tensor

from analysis._naming import Component
from hookedattn import HookedTransformer
from hookedattn.core.names import get_act_name

# The axes after the batch axis of the activation at each kind of hook point.
LAYOUTS: dict[str, tuple[str, ...]] = {
    **{k: ("pos", "d_model") for k in ("resid_pre", "resid_mid", "resid_post")},
    **{k: ("pos", "d_model") for k in ("attn_out", "mlp_out", "mlp_in", "mixer_in")},
    **{k: ("pos", "head", "d_model") for k in ("attn_in", "q_input", "k_input", "v_input")},
    **{k: ("pos", "head", "d_head") for k in ("q", "k", "v", "z", "rot_q", "rot_k")},
    # The query and key norms' normalised stream and output (their scale is per head in
    # some families and shared by all heads in others: not a fixed layout, not a kind).
    **{
        f"{site}_{part}": ("pos", "head", "d_head")
        for site in ("q_norm", "k_norm")
        for part in ("normalized", "out")
    },
    "result": ("pos", "head", "d_model"),
    **{k: ("head", "pos", "key_pos") for k in ("attn_scores", "pattern")},
    **{k: ("pos", "d_mlp") for k in ("pre", "pre_linear", "post")},
    # A mixture of experts' routing, and its shared expert's output.
    "router_logits": ("pos", "expert"),
    "expert_indices": ("pos", "k"),
    "shared_out": ("pos", "d_model"),
    # Each expert's write at each position: not an activation, patched at `mlp_out`.
    "expert_out": ("pos", "expert", "d_model"),
}
HEAD_KINDS: frozenset[str] = frozenset(k for k, axes in LAYOUTS.items() if "head" in axes)
# Kinds whose grid has an expert axis (router logits are patched a token at a time).
EXPERT_KINDS: frozenset[str] = frozenset({"expert_out"})
_MOE_KINDS = frozenset({"router_logits", "expert_indices", "expert_out"})
# With grouped-query attention these have one head per key/value head.
KEY_VALUE_KINDS: frozenset[str] = frozenset(
    {"k", "v", "rot_k", "k_input", "v_input", "k_norm_normalized", "k_norm_out"}
)


def n_heads_of(model: HookedTransformer, kind: str) -> int:
    """How many heads the activation `kind` has: key/value heads for keys and values."""
    cfg = model.cfg
    cfg.require_one_attention_shape(f"patching {kind!r} per head", key_value=True)
    return cfg.n_kv_heads if kind in KEY_VALUE_KINDS else cfg.n_heads


# A block mixes positions only where queries read keys and values. A patch at position p
# of a kind downstream of the keys and values (or on the query side) changes the block's
# output at position p alone; a patch of the residual stream, keys or values does not.
LOCAL_KINDS: frozenset[str] = frozenset(LAYOUTS) - {
    "resid_pre",
    "mixer_in",  # a hybrid's mixer reads every earlier position's input
    "attn_in",
    "k_input",
    "v_input",
    "k",
    "v",
    "rot_k",
    "k_norm_normalized",
    "k_norm_out",
}


# What each method cannot patch: an expert's write has no activation to differentiate or to
# freeze (only `activation_patch` defines its patch), and chosen experts have no gradient.
UNSUPPORTED: dict[str, frozenset[str]] = {
    "path patching": frozenset({"expert_out"}),
    "attribution patching": frozenset({"expert_out", "expert_indices"}),
}


def refuse_unsupported(kind: object, method: str) -> None:
    """A `ValueError` naming `kind` if `method` ("path patching", ...) cannot patch it."""
    if kind in UNSUPPORTED.get(method, ()):
        why = "it has no gradient" if kind == "expert_indices" else "use activation_patch"
        raise ValueError(f"{method} does not patch {kind!r} ({why})")


def probe_name(kind: str, layer: int) -> str:
    """The hook point that shows whether a model has `kind` in block `layer` (expert 0's
    rows for `expert_out`)."""
    return get_act_name(kind, layer, 0) if kind in EXPERT_KINDS else get_act_name(kind, layer)


def kind_layers(model: HookedTransformer, kind: str) -> list[int]:
    """The blocks that have `kind` (all of them, but in a hybrid model a head's kinds are
    in the blocks that attend only, and a mixture's in its blocks of experts)."""
    hooks = model.hook_dict
    return [layer for layer in range(model.cfg.n_layers) if probe_name(kind, layer) in hooks]


def available_kinds(model: HookedTransformer) -> list[str]:
    """The kinds this model can patch, in the order a block's forward reaches them."""
    order = {name: i for i, name in enumerate(model.hook_dict)}
    present = {}
    for kind in LAYOUTS:
        layers = kind_layers(model, kind)
        if layers:  # where the first block that has it reaches it
            start = order[get_act_name("resid_pre", layers[0])]
            present[kind] = order[probe_name(kind, layers[0])] - start
    return sorted(present, key=present.__getitem__)


def check_kind(model: HookedTransformer, kind: str) -> str:
    """`kind` if this model has it; otherwise a `ValueError` naming the kinds it has."""
    if kind in LAYOUTS and kind_layers(model, kind):
        return kind
    kinds = available_kinds(model)
    if kind in LAYOUTS:
        why = _why_missing(model, kind)
        raise ValueError(f"this model has no {kind!r} ({why}); kinds it has: {', '.join(kinds)}")
    close = difflib.get_close_matches(str(kind), kinds, n=3, cutoff=0.4)
    hint = f" (did you mean {' or '.join(repr(c) for c in close)}?)" if close else ""
    raise ValueError(f"unknown component kind {kind!r}{hint}; kinds: {', '.join(kinds)}")


def _why_missing(model: HookedTransformer, kind: str) -> str:
    cfg = model.cfg
    if kind in ("mlp_out", "mlp_in", "pre", "pre_linear", "post", "resid_mid") and cfg.attn_only:
        return "it is attention-only"
    if kind == "resid_mid" and cfg.parallel_attn_mlp:
        return "its blocks are parallel: attention and MLP both read resid_pre"
    if kind == "pre_linear":
        return "its MLP is not gated (gated_mlp=False)"
    if kind in ("rot_q", "rot_k"):
        return "it has no rotary embedding"
    if kind.startswith(("q_norm_", "k_norm_")):
        return "it has no query/key norms (use_qk_norm=False)"
    if kind in _MOE_KINDS:
        return "its MLPs are dense, not mixtures of experts (num_experts is None)"
    if kind == "shared_out":
        return "it has no shared expert (d_mlp_shared is None)"
    flags = {"result": "use_attn_result", "mlp_in": "use_hook_mlp_in", "attn_in": "use_attn_in"}
    flag = flags.get(kind, "use_split_qkv_input")
    return f"it was built without {flag}=True"


@dataclasses.dataclass(frozen=True)
class ComponentGrid:
    """Every component of one kind, in row-major order of `axes` (e.g. `layer pos head`)."""

    kind: str
    axes: tuple[str, ...]
    labels: tuple[tuple[str, ...], ...]

    @property
    def shape(self) -> tuple[int, ...]:
        """The size of each axis."""
        return tuple(len(tick) for tick in self.labels)

    @functools.cached_property
    def components(self) -> tuple[Component, ...]:
        """One `Component` per cell of the grid, in row-major order."""
        return tuple(
            Component(self.kind, **{a: int(tick) for a, tick in zip(self.axes, ticks, strict=True)})
            for ticks in itertools.product(*self.labels)
        )


def component_grid(
    model: HookedTransformer, kind: str, n_pos: int, by_pos: bool | None = None
) -> ComponentGrid:
    """Every component of `kind`: `[layer pos]` / `[layer]`, `[layer head]` / `[layer pos head]`.

    `by_pos=None` patches the residual-stream kinds one position at a time and the head
    kinds at every position at once (TransformerLens's defaults); an expert's write
    (`expert_out`: `[layer expert]`) like a head's.
    """
    check_kind(model, kind)
    is_head, is_expert = kind in HEAD_KINDS, kind in EXPERT_KINDS
    by_pos = (not (is_head or is_expert)) if by_pos is None else by_pos
    sizes = {"layer": model.cfg.n_layers, "pos": n_pos, "head": n_heads_of(model, kind),
             "expert": model.cfg.num_experts or 0}  # fmt: skip
    axes = ("layer",) + (("pos",) if by_pos else ()) + (("head",) if is_head else ())
    axes += ("expert",) if is_expert else ()
    ticks = {a: range(sizes[a]) for a in axes} | {"layer": kind_layers(model, kind)}
    labels = tuple(tuple(str(i) for i in ticks[a]) for a in axes)
    return ComponentGrid(kind, axes, labels)


def check_component(model: HookedTransformer, component: Component, n_pos: int) -> Component:
    """`component` if it names a region of this model for `n_pos` positions, else an error."""
    if not isinstance(component, Component):
        raise TypeError(f"expected a Component, got {type(component).__name__}")
    check_kind(model, component.name)
    cfg = model.cfg
    if not 0 <= component.layer < cfg.n_layers:
        raise ValueError(f"{component}: layer must be in 0..{cfg.n_layers - 1}")
    layers = kind_layers(model, component.name)
    if component.layer not in layers:
        raise ValueError(f"{component}: block {component.layer} has no {component.name!r}; "
                         f"the blocks that have it are {layers}")  # fmt: skip
    if component.head is not None:
        if component.name not in HEAD_KINDS:
            raise ValueError(f"{component}: {component.name!r} has no head axis; use head=None")
        n_heads = n_heads_of(model, component.name)
        if not 0 <= component.head < n_heads:
            raise ValueError(f"{component}: head must be in 0..{n_heads - 1}")
    if component.expert is not None:
        if "expert" not in LAYOUTS[component.name]:
            raise ValueError(f"{component}: {component.name!r} has no expert axis; use expert=None")
        if not 0 <= component.expert < cfg.num_experts:
            raise ValueError(f"{component}: expert must be in 0..{cfg.num_experts - 1}")
    elif component.name in EXPERT_KINDS:
        raise ValueError(f"{component}: {component.name!r} is one expert's: give expert=")
    if component.pos is not None and not 0 <= component.pos < n_pos:
        raise ValueError(f"{component}: pos must be in 0..{n_pos - 1} for {n_pos} positions")
    return component


def component_masks(
    components: Sequence[Component], hook_name: str, shape: Sequence[int]
) -> Bool[Tensor, "variant 1 ..."]:
    """Row i: where component i lies in the activation at `hook_name` (all False elsewhere).

    `shape` is the activation's shape after the batch axis; axes other than position and
    head have size 1 in the mask and broadcast.
    """
    return masks_at(components, [c.hook_name for c in components], hook_name, shape)


def masks_at(
    components: Sequence[Component],
    hook_names: Sequence[str],
    hook_name: str,
    shape: Sequence[int],
) -> Bool[Tensor, "variant 1 ..."]:
    """`component_masks`, given each component's hook name (`hook_names`)."""
    at = [name == hook_name for name in hook_names]
    layout = LAYOUTS[components[at.index(True)].name]
    match = torch.tensor(at).reshape(-1, *([1] * len(layout)))
    for axis_name in ("pos", "head", "expert"):
        if axis_name not in layout:
            continue
        axis = layout.index(axis_name)
        wanted = torch.tensor([_index(getattr(c, axis_name)) for c in components])
        positions = torch.arange(shape[axis])
        hit = (positions[None, :] == wanted[:, None]) | (wanted[:, None] < 0)
        match = match & _at_axis(hit, axis, len(layout))
    return rearrange(match, "variant ... -> variant 1 ...")


def _index(i: int | None) -> int:
    return -1 if i is None else i


def _at_axis(hit: Bool[Tensor, "variant size"], axis: int, ndim: int) -> Tensor:
    """`hit` reshaped so that its second axis is axis `axis` of an `ndim`-axis layout."""
    shape = [hit.shape[0]] + [1] * ndim
    shape[1 + axis] = hit.shape[1]
    return hit.reshape(shape)
