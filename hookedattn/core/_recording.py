"""Recording activations during a forward: the machinery behind `run_with_cache`.

What the cache holds never changes afterwards, and nothing outside it can change it: a
recorded tensor is the activation itself (no copy) unless something could write to it. It
is copied when a hook that could edit it in place is attached, when it keeps only some
positions, and when it is one of the caller's own tensors (the residual stream passed in
with `start_at_layer`, the one returned with `stop_at_layer`). The logits are the one
exception: the largest activation, returned and cached as one tensor (as in
TransformerLens) rather than twice. Each tensor's version counter is noted when it is
recorded, so an in-place edit made afterwards by any other route (the returned logits
included) is refused when the entry is next read (see `ActivationCache`).

A cache records its own forward only. A hook may run the model again (a nested
`run_with_cache`, or `model(other_prompt)`); the outer cache's hooks are still attached
then, so each recording counts the forwards of the model on its thread (a pre-hook and a
post-hook on the root module) and keeps only what runs at depth one: the inner forward's
activations go to the inner cache, or nowhere, never into the outer one.
"""

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Shaped
from torch import Tensor

from hookedattn.core import names as _names
from hookedattn.core._traced_constant import constant_when_traced
from hookedattn.core.cache import ActivationCache
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.hooked_root import HookedRootModule

NamesFilter = str | Sequence[str] | Callable[[str], bool] | None
PosSlice = int | slice | Sequence[int] | None


def _pos_index(pos_slice: PosSlice) -> slice | Tensor | None:
    if pos_slice is None:
        return None
    if isinstance(pos_slice, bool):
        raise TypeError("pos_slice must be an int, a slice or a list of ints, not a bool")
    if isinstance(pos_slice, int):
        # Keep the axis (size 1) so that every cached tensor keeps its named shape.
        return slice(pos_slice, pos_slice + 1) if pos_slice != -1 else slice(-1, None)
    if isinstance(pos_slice, slice):
        return pos_slice
    return torch.as_tensor(list(pos_slice), dtype=torch.long)


def _positions(
    t: Shaped[Tensor, "..."], axis: int, index: slice | Tensor, pos_slice: PosSlice, name: str
) -> Shaped[Tensor, "..."]:
    """`t` at the positions `index` selects on `axis`; a selection outside them is refused."""
    n_pos = t.shape[axis]
    if isinstance(index, Tensor) and index.numel():
        low, high = int(index.min()), int(index.max())
        if low < -n_pos or high >= n_pos:
            raise ValueError(
                f"pos_slice={pos_slice!r} is out of range at {name}, which has {n_pos} "
                f"positions (valid indices {-n_pos}..{n_pos - 1})"
            )
    selected = t[(slice(None),) * axis + (index,)]
    if selected.shape[axis] == 0 and n_pos > 0:
        raise ValueError(
            f"pos_slice={pos_slice!r} selects no position at {name}, which has {n_pos} "
            f"positions (valid indices {-n_pos}..{n_pos - 1})"
        )
    return selected


# As hook_points' thread check: read once when torch.compile traces, not a graph break.
@constant_when_traced
def _thread() -> int:
    return threading.get_ident()


class Depth:
    """How many forwards of the model are running on `thread` now (module docstring)."""

    def __init__(self, thread: int) -> None:
        self.thread, self.value = thread, 0

    def watch(self, model: Any) -> list[Any]:
        """Count `model`'s forwards from now on: the handles of the root's hooks that do."""
        return [
            model.register_forward_pre_hook(self.enter),
            model.register_forward_hook(self.leave, always_call=True),
        ]

    def enter(self, module: Any, args: Any) -> None:
        """A forward pre-hook of the root module."""
        if _thread() == self.thread:
            self.value += 1

    def leave(self, module: Any, args: Any, output: Any) -> None:
        """A forward hook of the root module (run also when the forward raises)."""
        if _thread() == self.thread:
            self.value -= 1


@dataclasses.dataclass
class Recorder:
    """Where a cached forward's activations go, and how each is kept (the options of
    `run_with_cache`; a generation's recorder keeps each step's with the same rules)."""

    index: slice | Tensor | None
    pos_slice: PosSlice
    remove_batch_dim: bool
    device: str | torch.device | None
    dtype: torch.dtype | None
    # Our forward never writes to an activation in place, but a user's hook may. Only then
    # can a recorded tensor change after the fact, so only then is it copied.
    must_copy: bool
    depth: Depth
    store: dict[str, Tensor] = dataclasses.field(default_factory=dict)
    versions: dict[str, int] = dataclasses.field(default_factory=dict)

    def forward_hook(self) -> Callable[[Tensor, HookPoint], None]:
        """The hook that records a forward activation: the tensor itself where no option
        asks for a change (one step), otherwise through `record`."""
        plain = self.index is None and self.device is None and self.dtype is None
        if plain and not (self.remove_batch_dim or self.must_copy):
            return self.save_reference
        return self.save_recorded

    def save_reference(self, x: Tensor, hook: HookPoint) -> None:
        """Keep the activation itself (of this cache's own forward only; detached where it
        is part of a graph, as it is, at no cost, where it is not)."""
        if self.depth.value == 1:
            t = self.store[hook.name] = x.detach() if x.requires_grad else x
            self.versions[hook.name] = t._version

    def save_recorded(self, x: Tensor, hook: HookPoint) -> None:
        """Keep the activation through `record` (of this cache's own forward only)."""
        if self.depth.value == 1:
            self.record(hook.name, x)

    def save_gradient(self, grad: Tensor, hook: HookPoint) -> None:
        """Keep the gradient at a hook point, as `<name>_grad`."""
        self.record(hook.name + "_grad", grad)

    def record(self, name: str, x: Tensor) -> None:
        """Keep `x` under `name`, with the positions, batch axis, device and dtype asked for."""
        t = x.detach() if x.requires_grad else x
        # An expert's rows have no batch or position axis: kept whole.
        rows = (self.index is not None or self.remove_batch_dim) and _names.is_rows(name)
        if self.index is not None and not rows:
            axis = _names.pos_axis(name.removesuffix("_grad"))
            t = _positions(t, axis, self.index, self.pos_slice, name)
        if self.remove_batch_dim and not rows:
            if t.shape[0] != 1:
                raise ValueError(
                    f"remove_batch_dim=True needs a batch of 1, got {t.shape[0]} at {name}"
                )
            t = t[0]
        if self.device is not None or self.dtype is not None:
            t = t.to(device=self.device, dtype=self.dtype)
        if self.index is not None and t.untyped_storage().nbytes() > t.numel() * t.element_size():
            t = t.clone()  # a slice (pos_slice): keep its positions, not the whole activation
        elif self.must_copy and t.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
            t = t.clone()
        self.store[name] = t
        self.versions[name] = t._version


def run_with_cache(
    model: HookedRootModule,
    model_args: tuple,
    model_kwargs: dict,
    *,
    names_filter: NamesFilter = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    remove_batch_dim: bool = False,
    incl_bwd: bool = False,
    pos_slice: PosSlice = None,
) -> tuple[Any, ActivationCache]:
    """Run `model(*model_args, **model_kwargs)` recording the selected activations."""
    points = model.hook_points_for(names_filter)
    must_copy = any(not h.is_cache for h in model.attached_hooks())
    thread = threading.get_ident()
    depth = Depth(thread)
    recorder = Recorder(
        _pos_index(pos_slice), pos_slice, remove_batch_dim, device, dtype, must_copy, depth
    )
    save = recorder.forward_hook()
    handles = [p.add_hook(save, _is_cache=True, _thread=thread) for p in points]
    if incl_bwd:
        handles += [
            p.add_hook(recorder.save_gradient, dir="bwd", _is_cache=True, _thread=thread)
            for p in points
        ]
    handles += depth.watch(model)
    try:
        output = model(*model_args, **model_kwargs)
        if incl_bwd:
            _differentiate(model, output)
    finally:
        for handle in handles:
            handle.remove()
    store, versions = recorder.store, recorder.versions
    shared = (output,) if _is_logits(store, output) else ()
    _copy_callers_tensors(store, versions, (model_args, model_kwargs, output), shared)
    n_layers = getattr(getattr(model, "cfg", None), "n_layers", 0)
    cache = ActivationCache(store, n_layers, has_batch_dim=not remove_batch_dim, _versions=versions)
    return output, cache


def _is_logits(store: dict[str, Tensor], output: Any) -> bool:
    """Whether the forward's output is the logits recorded at `unembed.hook_out`."""
    logits = store.get("unembed.hook_out")
    return isinstance(output, Tensor) and logits is not None and _same_tensor(logits, output)


def _same_tensor(a: Tensor, b: Tensor) -> bool:
    same_memory = a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    return same_memory and a.shape == b.shape and a.stride() == b.stride()


def _copy_callers_tensors(
    store: dict[str, Tensor], versions: dict[str, int], caller: Any, shared: tuple = ()
) -> None:
    """Copy the recorded tensors that share storage with a tensor the caller holds, except
    those in `shared` (kept as one tensor, their edits caught by the version counters).

    The residual stream passed in with `start_at_layer` reaches the cache unchanged, and
    so does the one returned with `stop_at_layer`; without a copy, the caller editing
    their own tensor would edit the cache.
    """
    kept = {t.untyped_storage().data_ptr() for t in shared}
    theirs = {t.untyped_storage().data_ptr() for t in _tensors_in(caller) if t.numel()} - kept
    for name, t in store.items():
        if t.numel() and t.untyped_storage().data_ptr() in theirs:
            if versions[name] != t._version:
                continue  # already edited: keep it, so that reading it says so
            store[name] = t.clone()
            versions[name] = store[name]._version


def _tensors_in(obj: Any) -> list[Tensor]:
    """The tensors in nested tuples, lists, dicts and dataclasses (an output, the args)."""
    if isinstance(obj, Tensor):
        return [obj]
    if isinstance(obj, tuple | list):
        return [t for item in obj for t in _tensors_in(item)]
    if isinstance(obj, dict):
        return [t for item in obj.values() for t in _tensors_in(item)]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [t for f in dataclasses.fields(obj) for t in _tensors_in(getattr(obj, f.name))]
    return []


def _differentiate(model: HookedRootModule, output: Any) -> None:
    """Backpropagate from a scalar output without touching the parameters' `.grad`."""
    if not isinstance(output, Tensor) or output.numel() != 1:
        shape = tuple(output.shape) if isinstance(output, Tensor) else type(output).__name__
        raise ValueError(
            f"incl_bwd=True differentiates the output, which must be a scalar; got {shape}. "
            f"Use return_type='loss', or differentiate a metric yourself."
        )
    params = [p for p in model.parameters() if p.requires_grad]
    if not output.requires_grad:
        raise ValueError("incl_bwd=True needs gradients: do not run under torch.no_grad()")
    torch.autograd.grad(output, params, allow_unused=True)
