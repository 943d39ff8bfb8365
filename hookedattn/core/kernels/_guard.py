"""The fused kernels' guard against non-finite values: decided once per forward.

A fused attention kernel may hide a value that is not finite (torch's CPU kernel returns 0
rather than NaN for a NaN query or key at some sizes) or spread one (a NaN at a blocked
key, plus the mask's -inf, is NaN at every query). So its result stands only where its
operands were finite; otherwise the layer's written-out equation runs, which keeps a NaN or
`inf` at exactly the positions that read it.

A check is a reduction per operand and, to read it, a synchronisation. Where nothing can
observe a forward (no hook on any hook point, no torch hook on any module:
`HookedRootModule.is_listened`), `guarded` checks once: each fused layer only notes the sums
of its queries and keys (`FiniteGuard.keeps`: what a kernel can hide), and one read of
their total with the stream's decides at the end (a value that is not finite in v, in z or
in what any sublayer writes reaches the stream the blocks leave; the unembedding after
them runs no fused attention). If the total is
not finite, the forward runs again with every layer checking on the spot, a KV cache's
appends undone first: the numbers of the guard per layer, since every other step is the
same. Where something listens, a second run would show it a first try, so each layer
checks its own operands before the next runs.
"""

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor


class FiniteGuard:
    """How one forward checks its fused kernels' operands: on the spot (`deferred` None),
    or noted in `deferred` for one check at the end (`guarded`)."""

    def __init__(self) -> None:
        self.deferred: list[Tensor] | None = None
        # Whether the one check at the end found the output and every noted operand finite.
        self.passed = False

    def keeps(self, z: Tensor, q: Tensor, k: Tensor, v: Tensor) -> bool:
        """Whether a fused kernel's `z` of `q`, `k`, `v` may stand. While the check is
        deferred, it stands and the sums of q and k are noted: they are what a fused kernel
        can hide, while a value that is not finite in v or z (or spread by the kernel)
        reaches the output, which is checked at the end. Otherwise, whether all four are
        finite (one synchronisation: a sum is finite only when every term is, or it
        overflows, and then the equation runs written out for nothing worse)."""
        if self.deferred is not None:
            self.deferred += [q.sum(), k.sum()]
            return True
        return math.isfinite(torch.stack([t.sum() for t in (z, q, k, v)]).sum().item())

    def finite(self, out: Tensor) -> bool:
        """Whether `out` (the stream the blocks leave) and every operand noted so far are
        finite (one synchronisation)."""
        device = out.device
        sums = [s if s.device == device else s.to(device) for s in self.deferred or ()]
        return math.isfinite(torch.stack([out.sum(), *sums]).sum().item())


class NotFiniteError(Exception):
    """A forward whose check was deferred met a value that is not finite: run it again."""


def guarded(model: Any, run: Callable[[], Tensor], guard: FiniteGuard, cache: Any) -> Tensor:
    """`run()`, the blocks of a forward (their fused kernels consult `guard`; it returns the
    stream they leave, or what is computed from it: a generation step's logits), checked
    once where nothing listens to `model` (module docstring; `guard.passed` says so),
    and run again checking every layer if that check fails; `cache` (a `KeyValueCache` or
    None) is left as the run that counts leaves it."""
    if model.is_listened():
        return run()
    guard.deferred = []
    try:
        with contextlib.nullcontext() if cache is None else cache.transaction():
            out = run()
            if not guard.finite(out):
                raise NotFiniteError
        guard.passed = True
        return out
    except NotFiniteError:
        pass
    finally:
        guard.deferred = None
    return run()
