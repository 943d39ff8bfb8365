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

from hookedattn.core import _recording, hook_points, kernels
from hookedattn.core import names as _names
from hookedattn.core._memory import free_memory
from hookedattn.core.cache import ActivationCache
from hookedattn.core.components.attention import Attention
from hookedattn.core.hook_points import HookPoint

NamesFilter = str | Sequence[str] | Callable[[str], bool] | None
# What the full forward holds at a key a query may not read (`kernels.masked`: -inf scores,
# so zero weights).
# The names whose last axis is the keys, and what a step's keys not yet written read as (a
# lightning indexer's scores, `[batch query_pos key_pos]`, like the attention's scores; a
# mixer's mixing, zero where a position reads a later one).
_LATER_KEY = {"hook_attn_scores": -torch.inf, "hook_pattern": 0.0, "hook_index_scores": -torch.inf,
              "hook_mixing": 0.0}  # fmt: skip


class StepRecorder:
    """Caching hooks on the hook points `names_filter` chooses, for one generation.

    Inside `attached()`, every forward's activations go into one store; `take()` hands it
    over (as a cache) and starts the next. `device` and `dtype` move and cast each
    activation as it is recorded, as in `run_with_cache`. With `keep`, every store taken
    is also kept in `stores`, in order (what `assembled` joins); with `defers` too, the
    values that exist only written out (norm scales, attention scores and patterns) are
    read later (`kernels.defer`: the fused kernels run at every step where no other hook
    needs them, and `finish` runs each such equation once over every step's inputs).
    """

    def __init__(
        self,
        model: Any,
        names_filter: NamesFilter,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        keep: bool = False,
        defers: bool = False,
    ) -> None:
        self.model, self.keep = model, keep
        points = model.hook_points_for(names_filter)
        # (A tensor-parallel model's hook points gather over ranks: they record as they run.)
        later = [p for p in points if defers and type(p) is HookPoint and _written_out_only(p)]
        self.points = [p for p in points if p not in later]
        self.later = later
        self.depth = _recording.Depth(threading.get_ident())
        self.recorder = _recording.Recorder(None, None, False, device, dtype, False, self.depth)
        self.stores: list[dict[str, Tensor]] = []
        # (store, first position, module, inputs) of each equation a step left for `finish`
        self.deferred: list[tuple[int, int, Any, tuple[Tensor, ...]]] = []
        self.offset = 0
        self._handles: list[Any] = []
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
        self._decide_copies()
        thread, save = self.depth.thread, self.recorder.forward_hook()
        self._handles = [p.add_hook(save, _is_cache=True, _thread=thread) for p in self.points]
        self._handles += [
            p.add_hook(save, _is_cache=True, _thread=thread, _defers_to=self) for p in self.later
        ]
        root = self.depth.watch(self.model)
        self._attached = True
        try:
            yield self
        finally:
            self._attached = False
            for handle in [*self._handles, *root]:
                handle.remove()
            self._handles = []

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

    def before_forward(self, offset: int) -> None:
        """A forward over positions from `offset` on is about to run. Decide whether its
        activations are copied: only when a hook that is not a cache is attached (it could
        edit them in place after they are recorded)."""
        self.offset = offset
        self._decide_copies()

    def _decide_copies(self) -> None:
        """Copy what is recorded only where a hook that is not a cache is attached; the
        recording hooks take the one that keeps the tensor itself otherwise."""
        version = hook_points.hooks_version()  # unchanged since the last forward: no hook was
        if version == self._copy_version:  # attached or removed since, the answer holds
            return
        self.recorder.must_copy = any(not h.is_cache for h in self.model.attached_hooks())
        save = self.recorder.forward_hook()
        for handle in self._handles:
            handle.fn = save
        self._copy_version = version

    def defer(self, module: Any, inputs: tuple[Tensor, ...]) -> None:
        """Keep what a kernel hands over (`kernels.defer`) for `finish`, if this forward is
        recorded (one a hook runs inside a step is not)."""
        if self.depth.value != 1:
            return
        item = (len(self.stores), self.offset, module, inputs)
        for i in range(len(self.deferred) - 1, -1, -1):  # this forward's items, newest first
            if self.deferred[i][0] != item[0]:
                break
            if self.deferred[i][2] is module:
                # A module run twice in one forward (`ln1` over per-head q, k, v copies): its
                # hook points record the last run, so the cache keeps that one.
                self.deferred[i] = item
                return
        self.deferred.append(item)

    def take(self) -> ActivationCache:
        """The activations recorded since the last `take`, as one forward's cache."""
        store, self.recorder.store = self.recorder.store, {}
        versions, self.recorder.versions = self.recorder.versions, {}
        if self.keep:
            self.stores.append(store)
        return ActivationCache(dict(store), self.model.cfg.n_layers, _versions=dict(versions))

    def check_room(self, n_first: int, n_total: int, device: Any) -> None:
        """After the first forward (over `n_first` positions), refuse a generation whose
        cache over `n_total` positions would not fit in the memory `device` has free (its
        stores and the joined cache, twice the cache, are held at the end): a
        `ValueError` with the sizes, before the steps run, rather than the allocator's
        failure after them."""
        free = free_memory(self.recorder.device or device)
        if free is None or not self.keep or not self.stores:
            return
        total, patterns = self.projected_bytes(n_first, n_total)
        if 2 * total > free:
            raise ValueError(
                f"the cache over this generation ({n_total} positions) would take about "
                f"{_gb(total)} GB, held twice while it is joined, and the device has "
                f"{_gb(free)} GB free (attention scores and patterns: {_gb(patterns)} GB, "
                f"growing with the square of the length): record fewer hook points "
                f"(names_filter=), fewer new tokens, a smaller dtype= or another device=, or "
                f"use generate_steps, which hands each step's cache over as it is made"
            )

    def projected_bytes(self, n_first: int, n_total: int) -> tuple[float, float]:
        """The bytes of the cache over `n_total` positions, from what the first forward
        (over `n_first`) recorded and left for later: in all, and in scores and patterns
        (which grow with the square of the length; the rest with the length)."""
        grow, total, patterns = n_total / n_first, 0.0, 0.0
        for name, t in self.stores[0].items():
            quadratic = name.endswith(_KEY_AXES)
            size = t.numel() * t.element_size() * (grow**2 if quadratic else grow)
            total, patterns = total + size, patterns + (size if quadratic else 0)
        for _, _, module, inputs in self.deferred:  # the first forward's, not recorded yet
            size = self._deferred_bytes(module, inputs[0], n_total)
            total += size
            patterns += size if isinstance(module, Attention) else 0
        return total, patterns

    def _deferred_bytes(self, module: Any, x: Tensor, n_total: int) -> float:
        """The bytes the values a module left for later will take over `n_total` positions:
        each recorded score or pattern `[batch head n n]`; a norm's outputs like its input."""
        itemsize = torch.empty((), dtype=self.recorder.dtype or x.dtype).element_size()
        points = [p for p in self.later if p in module.modules()]
        if isinstance(module, Attention):  # x: the queries, [batch pos head d_head]
            return float(len(points) * x.shape[0] * x.shape[2] * n_total**2 * itemsize)
        per_position = x.numel() / x.shape[1]  # hook_normalized: x's shape; hook_scale: 1 wide
        widths = [per_position if p.name.endswith("normalized") else per_position / x.shape[-1]
                  for p in points]  # fmt: skip
        return float(sum(widths) * n_total * itemsize)

    def finish(self, cache: Any) -> None:
        """Run every deferred equation once, over the inputs of every step that left it
        (an attention's queries read the KV cache's keys and values, each query with its
        own causal past and padding, as in the full forward), through the hook points that
        record them; each step's store gets its own positions."""
        groups: dict[int, list[tuple[int, int, Any, tuple[Tensor, ...]]]] = {}
        for item in self.deferred:
            groups.setdefault(id(item[2]), []).append(item)
        self.deferred = []
        for items in groups.values():
            recorded = self._written_out(items, cache)
            for name, t in recorded.items():
                axis, start = _names.pos_axis(name), 0
                for index, _, _, inputs in items:
                    n = inputs[0].shape[1]
                    self.stores[index][name] = t.narrow(axis, start, n)
                    start += n

    def _written_out(self, items: list, cache: Any) -> dict[str, Tensor]:
        """One module's written-out equation over the deferred inputs, recorded."""
        module = items[0][2]
        joined = torch.cat([inputs[0] for _, _, _, inputs in items], dim=1)
        store, self.recorder.store = self.recorder.store, {}
        try:  # the hook points record it, through this recorder's own hooks
            with self.own_forward():
                if isinstance(module, Attention):
                    self._attention(module, joined, items, cache)
                else:
                    module.written_out(joined)
            return self.recorder.store
        finally:
            self.recorder.store = store

    def _attention(self, attn: Any, q: Tensor, items: list, cache: Any) -> None:
        """`attn.written_out` for queries at the deferred positions, over every key."""
        positions = [o + i for _, o, _, inputs in items for i in range(inputs[0].shape[1])]
        queries = torch.tensor(positions, device=q.device)
        blocks = enumerate(self.model.blocks)
        layer = next(i for i, block in blocks if getattr(block, "attn", None) is attn)
        source = self.model.cfg.kv_source_layer(layer)  # a block reading another's keys
        entry = cache[layer if source is None else source]
        window = self.model.cfg.window_size
        chunked = self.model.cfg.window_chunked
        context = kernels.rows_context(cache.previous_attention_mask, queries, window, chunked)
        attn.written_out(q, entry.past_keys, entry.past_values, context)


def _written_out_only(point: HookPoint) -> bool:
    """Whether `point`'s value exists only where its equation runs written out."""
    return point.name.rpartition(".")[2] in _WRITTEN_OUT_ONLY


_WRITTEN_OUT_ONLY = ("hook_scale", "hook_normalized", "hook_attn_scores", "hook_pattern")
# [... query_pos key_pos]
_KEY_AXES = ("hook_attn_scores", "hook_pattern", "hook_index_scores", "hook_mixing")


def _gb(n: float | int) -> str:
    return f"{n / 2**30:.2f}"


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
