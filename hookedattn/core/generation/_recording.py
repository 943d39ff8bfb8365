"""The activations of a generation: recorded at every step's forward, assembled into one
`ActivationCache` over the prompt and the generated positions.

Each forward of a KV-cached generation runs the positions the cache does not hold yet: the
prompt first, then one token per row. Recording the chosen hook points at each of them and
concatenating along the position axis gives what `run_with_cache` of the final sequence
records, without running it again: position `i` reads keys and values of positions `<= i`
only, so its activations do not depend on what came later. Attention scores and patterns
grow a key position per step; each step's rows are padded with what the full forward holds
at a later key (-inf scores, zero weights). The last generated token is never read by a
forward that chooses a token, so the cache over it comes from one more step.

Each activation is kept by `run_with_cache`'s own recorder (`core._recording.Recorder`):
the same rules for what is copied, moved and cast, and for forwards nested in a hook.
"""

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import Tensor

from hookedattn.core import _recording, hook_points
from hookedattn.core import names as _names
from hookedattn.core.cache import ActivationCache

NamesFilter = str | Sequence[str] | Callable[[str], bool] | None
# What the full forward holds at a key a query may not read (`kernels.masked`: -inf scores,
# so zero weights).
_LATER_KEY = {"hook_attn_scores": -torch.inf, "hook_pattern": 0.0}


class StepRecorder:
    """Caching hooks on the hook points `names_filter` chooses, for one generation.

    Inside `attached()`, every forward's activations go into one store; `take()` hands it
    over (as a cache) and starts the next. `device` and `dtype` move and cast each
    activation as it is recorded, as in `run_with_cache`. With `keep`, every store taken
    is also kept in `stores`, in order (what `assembled` joins).
    """

    def __init__(
        self,
        model: Any,
        names_filter: NamesFilter,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        keep: bool = False,
    ) -> None:
        self.model, self.keep = model, keep
        self.points = model.hook_points_for(names_filter)
        self.depth = _recording.Depth(threading.get_ident())
        self.recorder = _recording.Recorder(None, None, False, device, dtype, False, self.depth)
        self.stores: list[dict[str, Tensor]] = []
        self._attached = False
        self._copy_version = -1

    @contextlib.contextmanager
    def attached(self) -> Iterator["StepRecorder"]:
        """The recording hooks, attached for this thread's forwards until the block ends.
        Inside a block of its own it attaches nothing more: a generation whose steps no
        caller sees between them (`generate(..., return_cache=True)`) attaches them once."""
        if self._attached:
            yield self
            return
        thread, save = self.depth.thread, self.recorder.save_recorded
        handles = [p.add_hook(save, _is_cache=True, _thread=thread) for p in self.points]
        handles += self.depth.watch(self.model)
        self._attached = True
        try:
            yield self
        finally:
            self._attached = False
            for handle in handles:
                handle.remove()

    @contextlib.contextmanager
    def own_forward(self) -> Iterator[None]:
        """A forward of the generation's own that does not pass the model's `__call__` (the
        decode step), counted as the root's hooks count the others: its activations are
        recorded, those of a forward a hook runs inside it are not."""
        self.depth.value += 1
        try:
            yield
        finally:
            self.depth.value -= 1

    def before_forward(self) -> None:
        """Decide whether this forward's activations are copied: only when a hook that is
        not a cache is attached (it could edit them in place after they are recorded)."""
        version = hook_points.hooks_version()  # unchanged since the last forward: no hook was
        if version != self._copy_version:  # attached or removed since, the answer holds
            must_copy = any(not h.is_cache for h in self.model.attached_hooks())
            self.recorder.must_copy = must_copy
            self._copy_version = version

    def take(self) -> ActivationCache:
        """The activations recorded since the last `take`, as one forward's cache."""
        store, self.recorder.store = self.recorder.store, {}
        versions, self.recorder.versions = self.recorder.versions, {}
        if self.keep:
            self.stores.append(store)
        return ActivationCache(dict(store), self.model.cfg.n_layers, _versions=dict(versions))


def assembled(stores: list[dict[str, Tensor]], n_layers: int) -> ActivationCache:
    """The activations of consecutive forwards over one sequence, joined along positions:
    what one forward over all of them records. Every name must cover every position once."""
    names = list(dict.fromkeys(name for store in stores for name in store))  # forward order
    parts = {name: [store[name] for store in stores if name in store] for name in names}
    lengths = {name: sum(p.shape[_names.pos_axis(name)] for p in ps) for name, ps in parts.items()}
    n_keys = max(lengths.values(), default=0)
    short = sorted(name for name, length in lengths.items() if length != n_keys)
    if short:
        raise ValueError(
            f"the generation's forwards recorded {short} at fewer positions than the others "
            f"({n_keys}): a cache over the generation needs every step to record the same "
            f"hook points"
        )
    joined = {name: _joined(parts[name], name, n_keys) for name in names}
    return ActivationCache(joined, n_layers)


def _joined(parts: list[Tensor], name: str, n_keys: int) -> Tensor:
    axis = _names.pos_axis(name)
    fill = _LATER_KEY.get(name.rpartition(".")[2])
    if fill is not None:  # [batch head query_pos key_pos]: each step's keys so far
        parts = [_padded_keys(p, n_keys, fill) for p in parts]
    return parts[0] if len(parts) == 1 else torch.cat(parts, dim=axis)


def _padded_keys(part: Tensor, n_keys: int, fill: float) -> Tensor:
    missing = n_keys - part.shape[-1]
    if missing == 0:
        return part
    later = part.new_full((*part.shape[:-1], missing), fill)
    return torch.cat([part, later], dim=-1)
