"""Values read later: a hook point's value handed over as the inputs of its equation.

A norm's scale and normalised stream, and an attention layer's scores and pattern, exist
only where the equation runs written out; a hook on them makes the kernel write it out at
every forward. A recorder that can wait (a generation's cache, handed over only at the end)
attaches its hook with a `defers_to`: where every hook at those points has one, the fused
kernel runs and `defer` hands each recorder the equation's inputs (a norm's input; a
layer's queries), from which it runs the component's written-out equation, through the
same hook points, once over every forward's, afterwards. Where the equation runs written out
anyway (a soft cap, a hook that needs the value now), the hooks get the value as it is made.
"""

from typing import Any

from torch import Tensor


def defer(module: Any, inputs: tuple[Tensor, ...], *points: Any) -> None:
    """Hand `inputs` of `module`'s equation to every recorder waiting at `points` (once
    each)."""
    owners = {id(h.defers_to): h.defers_to for p in points for h in p._fwd if h.defers_to}
    for owner in owners.values():
        owner.defer(module, inputs)
