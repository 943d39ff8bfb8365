"""How a state-space mixer computes its reads: from the state its cache carries, or its
mixing matrix written out.

Mamba-2's and the gated delta net's reads are `o = M v` over every position, and
`hook_mixing` holds `M`. Where nothing reads `M` in a forward (and fused kernels are
allowed, `use_fused_kernels`), the same reads come from the state the positions before left,
in runs of 64 positions (`ssd_rule`, `delta_rule`), without forming `M`: memory linear in
the positions, and a generation step costs `d_state x d_head` per head. Either way a cache
carries the state on, so that the next forward may take either path; both give the
equation's numbers to rounding.
"""

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from hookedattn.core.hook_points import HookPoint
from hookedattn.core.kv_cache import MixerCacheEntry


def mix(
    hook: HookPoint,
    fused: bool,
    past: MixerCacheEntry,
    by_state: Callable[[Tensor | None], tuple[Tensor, Tensor]],
    written_out: Callable[[], Any],
) -> Any:
    """The new positions' reads: `by_state(state)`, which returns them and the state after
    the last, from the state `past` carried, where `fused` and nothing is attached to
    `hook` (the mixing matrix's); otherwise `written_out()`, the state carried on all the
    same (unless `past` is frozen, and so read only)."""
    state = past.carried("state")
    if fused and not hook.is_active:
        reads, after = by_state(state)
        past.carry("state", after)
        return reads
    if not past.frozen:
        past.carry("state", by_state(state)[1])
    return written_out()


def in_runs(
    step: Callable[..., tuple[Tensor, Tensor]],
    per_position: Sequence[Tensor],
    state: Tensor | None,
    chunk: int,
) -> tuple[Tensor, Tensor | None]:
    """`step(*runs, state)` over runs of `chunk` positions of the `per_position` tensors
    (their axis 1), each run from the state the one before it left: the reads of every run
    concatenated along the positions, and the state after the last (the chunked form of
    `ssd_rule` and `delta_rule`, memory linear in the positions)."""
    reads = []
    for start in range(0, per_position[0].shape[1], chunk):
        run = slice(start, start + chunk)
        read, state = step(*(t[:, run] for t in per_position), state)
        reads.append(read)
    return torch.cat(reads, dim=1), state
