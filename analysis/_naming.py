"""How analysis names heads and components, and spells their labels: in one place.

A component is a `Component` (an activation of one block, optionally one head and one
position); a head may also be given as its label `"L1H2"` or as `(layer, head)`, which
`parse_head` reads back. Every label in every analysis result is spelled here:
`"L1H2"` (a head), `"L1H2 pos 4"` (a head at one position), `"L0 pos 4"`, `"L0N42"`
(a neuron), `"L0E3"` (an expert), and `"z L1H2 pos 4"` for a component with its kind.
"""

import dataclasses
import functools
import re

from hookedattn.core.names import get_act_name, head_label

_HEAD_LABEL = re.compile(r"^L(\d+)H(\d+)$")
# The short names of one expert's rows (`names.get_act_name` takes the expert's index).
_EXPERT_ROWS = frozenset(f"expert_{p}" for p in ("in", "pre", "pre_linear", "post", "out"))


def neuron_label(layer: int, neuron: int) -> str:
    """`"L{layer}N{neuron}"`, the label of one MLP neuron."""
    return f"L{layer}N{neuron}"


def expert_label(layer: int, expert: int) -> str:
    """`"L{layer}E{expert}"`, the label of one expert of a mixture of experts."""
    return f"L{layer}E{expert}"


def component_label(
    layer: int, head: int | None = None, pos: int | None = None, expert: int | None = None
) -> str:
    """`"L1H6 pos 11"`, `"L1H6"`, `"L0E3 pos 4"`, `"L0 pos 4"` or `"L0"`: where a
    component lies."""
    where = f"L{layer}" if head is None else head_label(layer, head)
    if expert is not None:
        where = expert_label(layer, expert)
    return where if pos is None else f"{where} pos {pos}"


@dataclasses.dataclass(frozen=True)
class Component:
    """One region of an activation: `name` of block `layer`, one head and/or position.

    `Component("z", 1, head=3)` is head L1H3's output at every position;
    `Component("resid_pre", 0, pos=4)` is the residual stream entering block 0 at
    position 4; `Component("pattern", 1, head=0, pos=7)` is head L1H0's attention from
    query position 7. `head=None` / `pos=None` mean all heads / all positions. In a
    mixture of experts, `expert` narrows to one expert: `Component("expert_out", 0,
    expert=3)` is what expert L0E3 writes, `Component("router_logits", 1, pos=2,
    expert=0)` one router logit.
    """

    name: str
    layer: int
    head: int | None = None
    pos: int | None = None
    expert: int | None = None

    @functools.cached_property
    def hook_name(self) -> str:
        """The full hook name, e.g. `blocks.1.attn.hook_z` (an expert's rows for the
        `expert_*` kinds: `blocks.0.mlp.experts.3.hook_out`)."""
        if self.name in _EXPERT_ROWS:
            return get_act_name(self.name, self.layer, self.expert or 0)
        return get_act_name(self.name, self.layer)

    def label(self) -> str:
        """A short label for plots and reprs: `z L1H3`, `resid_pre L0 pos 4`."""
        where = component_label(self.layer, self.head, self.pos, self.expert)
        return f"{self.name} {where}"


# A head: its label "L1H2", (layer, head), or a Component with a head (e.g. of kind "z").
HeadSpec = str | tuple[int, int] | Component


def parse_head(spec: object, n_layers: int, n_heads: int) -> tuple[int, int]:
    """`(layer, head)` from `"L1H2"`, `(1, 2)` or `Component("z", 1, head=2)`; negative
    indices count from the end."""
    usage = "a head is 'L<layer>H<head>' (e.g. 'L1H2'), (layer, head) or a Component with a head"
    if isinstance(spec, str):
        match = _HEAD_LABEL.match(spec)
        if not match:
            raise ValueError(f"{usage}; got {spec!r}")
        layer, head = int(match.group(1)), int(match.group(2))
    elif isinstance(spec, Component) and spec.head is not None:
        layer, head = spec.layer, spec.head
    elif is_head_pair(spec):
        layer, head = spec
    else:
        raise TypeError(f"{usage}; got {spec!r}")
    if not -n_layers <= layer < n_layers:
        raise ValueError(f"layer {layer} of head {spec!r} is out of range 0..{n_layers - 1}")
    if not -n_heads <= head < n_heads:
        raise ValueError(f"head {head} of {spec!r} is out of range 0..{n_heads - 1}")
    return layer % n_layers, head % n_heads


def is_head_pair(spec: object) -> bool:
    """Whether `spec` is a `(layer, head)` pair of ints."""
    return (
        isinstance(spec, tuple)
        and len(spec) == 2
        and all(isinstance(i, int) and not isinstance(i, bool) for i in spec)
    )
