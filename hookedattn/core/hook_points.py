"""Hook points (TransformerLens's `HookPoint`): where hooks read or replace activations.

A `HookPoint` is an identity module with a name. An activation passes through it on its
own line of a forward (`q = self.hook_q(q)`), which is the place where it can be read,
cached or replaced. With nothing attached, calling a hook point is one Python attribute
test: it skips `nn.Module.__call__` (and torch's hook dispatch) altogether, so a model
with hundreds of them runs at the speed of one without.

Hooks are functions `fn(activation, hook=hook_point)`. Returning a tensor replaces the
activation (same shape and dtype, checked); returning None keeps it. A backward hook
receives the gradient of the activation and may return a replacement gradient. Unlike
TransformerLens, a backward hook is attached to the autograd graph when the forward runs,
so `run_with_hooks(..., bwd_hooks=...)` followed by `.backward()` calls it even though the
hook is no longer attached to the hook point by then.

Two hook points can see one tensor (`blocks.L.hook_resid_post` returns the tensor that
`blocks.{L+1}.hook_resid_pre` receives; likewise `hook_embed` and `blocks.0.hook_resid_pre`
on a model without learned positions). In the backward they act as two points in sequence:
the later point's hooks see the gradient first, and what they return is what the earlier
point's hooks (and its cached `_grad`) see.

A forward installed on a hook point's instance (nnsight's `NNsight(model)` puts one on every
module, to hand each module's output to a trace) is reached through `nn.Module.__call__`
once the model has noticed it (`HookedRootModule._notice_wrappers`, at the start of
each forward): the point then counts as listened, needs its value (the written-out equations
run) and runs that forward, which runs the point's own hooks. Otherwise a hook point skips
`nn.Module.__call__`, so a torch hook on one never runs.

Threads: hooks attached for a scope (`hooks()`, `run_with_hooks`, `run_with_cache`) belong
to the thread that attached them. A forward in another thread that would run one of them
raises a `RuntimeError` instead, so two threads never see each other's scoped hooks; hooks
attached with `add_hook` belong to the model and run in every thread. (Under
`torch.compile` the thread is read when the graph is traced.)
"""

import dataclasses
import itertools
import threading
from collections.abc import Callable
from typing import Any, Literal

from torch import Tensor, nn

from hookedattn.core import names as _names
from hookedattn.core._traced_constant import constant_when_traced

HookFn = Callable[..., Tensor | None]
NameOrFilter = str | Callable[[str], bool]
Direction = Literal["fwd", "bwd"]


@dataclasses.dataclass(eq=False)
class LensHandle:
    """One hook attached to one hook point; `remove()` detaches it (idempotent)."""

    hook_point: "HookPoint"
    fn: HookFn
    dir: Direction
    is_permanent: bool
    # Caching hooks are bookkeeping, not edits: while only they are attached, the cache
    # can keep activations without copying them (nothing can write to them in place).
    is_cache: bool = False
    # The thread whose scope attached this hook (`threading.get_ident()`), or None for a
    # hook of the model's own (attached with `add_hook`), which runs in every thread.
    thread: int | None = None
    # A recorder that can take a written-out value later (`kernels.defer`): where every hook
    # at a point has one, a fused kernel may run and hand each the equation's inputs.
    defers_to: Any = None

    def remove(self) -> None:
        """Detach this hook from its hook point; a second call does nothing."""
        self.hook_point._remove(self)


class HookPoint(nn.Module):
    """An identity function with a name, where hooks read or replace an activation.

    `name` is set by the enclosing `HookedRootModule`. `ctx` is a dict that hooks may use
    to keep state between calls (cleared by `clear_context`).
    """

    name: str
    ctx: dict[str, Any]
    _fwd: list[LensHandle]
    _bwd: list[LensHandle]
    is_active: bool
    needs_value: bool

    def __init__(self) -> None:
        super().__init__()
        # Plain attributes (none a tensor or module), set in the instance's dict at once: a
        # model builds a hundred hook points or more, and nn.Module.__setattr__ checks each
        # value for a parameter, buffer or module.
        vars(self).update(
            name="<unnamed hook point>",
            ctx={},  # state a hook may keep between calls
            _fwd=[],  # forward LensHandles, in the order they run
            _bwd=[],
            # Plain attributes, not properties: the kernels read them at every sublayer of
            # every forward, where a property's call would be most of an idle point's cost.
            # Whether any hook (forward or backward, of any scope) is attached here now, or
            # a forward installed on the instance (nnsight's) may read or replace the value.
            is_active=False,
            # Whether a hook here needs the value in this forward: what the kernels read to
            # decide whether an activation that exists only written out must be computed.
            # False where every hook can take it later (`kernels.defer`).
            needs_value=False,
            _listening=False,  # a hook that is not a cache's (`HookedRootModule.is_listened`)
            # A forward installed on this instance (nnsight's): reached through
            # nn.Module.__call__.
            _wrapped=False,
        )

    def __call__(self, x: Tensor) -> Tensor:
        # The fast path: with no hook attached, a hook point is a single attribute test.
        if not self.is_active:
            return x
        if self._wrapped:
            return nn.Module.__call__(self, x)  # the instance's forward, which calls ours
        return self._run_hooks(x)

    def forward(self, x: Tensor) -> Tensor:
        """`x` after this point's hooks: what a forward installed on the instance wraps."""
        return self._run_hooks(x)

    def layer(self) -> int | None:
        """The block this hook point belongs to, or None outside the blocks."""
        return _names.layer_of(self.name)

    @property
    def fwd_hooks(self) -> tuple[LensHandle, ...]:
        """Forward hooks attached here, in the order they run."""
        return tuple(self._fwd)

    @property
    def bwd_hooks(self) -> tuple[LensHandle, ...]:
        """Backward hooks attached here, in the order they are registered on the graph."""
        return tuple(self._bwd)

    def has_hooks(
        self, dir: Direction | Literal["both"] = "both", including_permanent: bool = True
    ) -> bool:
        """Whether a hook is attached here in direction `dir` (TransformerLens's `has_hooks`)."""
        handles = [h for h in (*self._fwd, *self._bwd) if dir in ("both", h.dir)]
        return any(including_permanent or not h.is_permanent for h in handles)

    def add_hook(
        self,
        fn: HookFn,
        dir: Direction = "fwd",
        is_permanent: bool = False,
        prepend: bool = False,
        *,
        _is_cache: bool = False,
        _thread: int | None = None,
        _defers_to: Any = None,
    ) -> LensHandle:
        """Attach `fn` here; `prepend=True` runs it before the hooks already attached."""
        if dir not in ("fwd", "bwd"):
            raise ValueError(f"dir must be 'fwd' or 'bwd', got {dir!r}")
        if not callable(fn):
            raise TypeError(f"a hook must be callable, got {type(fn).__name__}")
        handle = LensHandle(self, fn, dir, is_permanent, _is_cache, _thread, _defers_to)
        hooks = self._fwd if dir == "fwd" else self._bwd
        hooks.insert(0, handle) if prepend else hooks.append(handle)
        self._update_active()
        return handle

    def remove_hooks(
        self, dir: Direction | Literal["both"] = "fwd", including_permanent: bool = False
    ) -> None:
        """Detach this point's hooks in direction `dir` (permanent ones only if asked)."""
        for handle in [*self._fwd, *self._bwd]:
            if dir in ("both", handle.dir) and (including_permanent or not handle.is_permanent):
                self._remove(handle)

    def clear_context(self) -> None:
        """Empty `ctx`."""
        self.ctx.clear()

    def _remove(self, handle: LensHandle) -> None:
        hooks = self._fwd if handle.dir == "fwd" else self._bwd
        if handle in hooks:
            hooks.remove(handle)
        self._update_active()

    def _notice_wrapper(self) -> None:
        """Follow whether a forward is installed on this instance (`_wrapped`)."""
        wrapped = "forward" in self.__dict__
        if wrapped != self._wrapped:
            object.__setattr__(self, "_wrapped", wrapped)
            self._update_active()

    def _update_active(self) -> None:
        # object.__setattr__, not nn.Module's: that one looks for parameters, buffers and
        # submodules on every assignment, and run_with_cache flips this flag twice per point.
        # An installed forward is a listener that needs the value now, and it may edit it.
        handles = (*self._fwd, *self._bwd)
        wrapped = self._wrapped
        object.__setattr__(self, "is_active", wrapped or bool(handles))
        needs_value = wrapped or any(h.defers_to is None for h in handles)
        object.__setattr__(self, "needs_value", needs_value)
        object.__setattr__(self, "_listening", wrapped or not all(h.is_cache for h in handles))
        global _version
        _version = next(_CHANGES)

    def _run_hooks(self, x: Tensor) -> Tensor:
        if self._fwd:
            x = self._run_forward_hooks(x)
        if self._bwd and x.requires_grad:
            x = self._attach_backward_hooks(x)
        return x

    def _run_forward_hooks(self, x: Tensor) -> Tensor:
        """The activation after every forward hook has read (or replaced) it, in order."""
        thread = _current_thread()
        for handle in tuple(self._fwd):
            if handle.thread is not None and handle.thread != thread:
                raise RuntimeError(self._foreign_hook_message(handle))
            out = handle.fn(x, hook=self)
            if out is not None:
                x = self._checked_replacement(x, out, handle.fn)
        return x

    def _attach_backward_hooks(self, x: Tensor) -> Tensor:
        """`x` with this point's backward hooks registered on the graph."""
        # Hooks registered on one tensor run in the order they were registered, the
        # forward's; when this tensor also passed an earlier hook point (resid_post ->
        # the next resid_pre), that point's hooks would see the gradient before ours
        # edit it. A view gives this point a node of its own, reached first backwards.
        thread = _current_thread()
        x = x.view_as(x)
        for handle in tuple(self._bwd):
            self._check_thread(handle, thread)
            x.register_hook(_GradientHook(handle.fn, self))
        return x

    def _check_thread(self, handle: LensHandle, thread: int) -> None:
        if handle.thread is not None and handle.thread != thread:
            raise RuntimeError(self._foreign_hook_message(handle))

    def _foreign_hook_message(self, handle: LensHandle) -> str:
        fn_name = getattr(handle.fn, "__name__", repr(handle.fn))
        return (
            f"a forward in thread {threading.get_ident()} reached the {handle.dir} hook "
            f"{fn_name} at {self.name}, attached for a scope (hooks(), run_with_hooks, "
            f"run_with_cache) by thread {handle.thread}. A model runs one thread's scoped "
            f"hooks at a time: give each thread its own model (model.copy()), or attach "
            f"hooks meant for every thread with add_hook"
        )

    def _checked_replacement(self, old: Tensor, new: object, fn: HookFn) -> Tensor:
        fn_name = getattr(fn, "__name__", repr(fn))
        if not isinstance(new, Tensor):
            raise TypeError(
                f"hook {fn_name} at {self.name} returned {type(new).__name__}; a hook must "
                f"return a tensor (to replace the activation) or None (to keep it)"
            )
        if new.shape != old.shape or new.dtype != old.dtype:
            raise ValueError(
                f"hook {fn_name} at {self.name} returned a tensor of shape "
                f"{tuple(new.shape)} and dtype {new.dtype}; the activation there has shape "
                f"{tuple(old.shape)} and dtype {old.dtype}"
            )
        return new

    def extra_repr(self) -> str:
        return f"name={self.name!r}, fwd={len(self._fwd)}, bwd={len(self._bwd)}"


# Bumped whenever a hook is attached or removed at any hook point (`hooks_version`).
_CHANGES = itertools.count(1)
_version = 0


def hooks_version() -> int:
    """A number that changes whenever a hook is attached to or removed from any hook point
    (of any model, in any thread): a decision about the attached hooks, cached with the
    number it was made at, holds while the number is the same."""
    return _version


# torch.compile cannot trace threading.get_ident (it would split the graph at every hook
# point); marked constant, it is read once when the graph is traced (`_traced_constant`).
@constant_when_traced
def _current_thread() -> int:
    return threading.get_ident()


@dataclasses.dataclass(frozen=True)
class _GradientHook:
    """Calls a backward hook with the gradient of the activation at `hook_point`."""

    fn: HookFn
    hook_point: HookPoint

    def __call__(self, grad: Tensor) -> Tensor | None:
        out = self.fn(grad, hook=self.hook_point)
        if isinstance(out, tuple) and len(out) == 1:
            out = out[0]  # TransformerLens's backward hooks return `(grad,)`
        if out is None:
            return None
        return self.hook_point._checked_replacement(grad, out, self.fn)


def is_hook_point(module: nn.Module) -> bool:
    """Whether `module` is a `HookPoint`."""
    return isinstance(module, HookPoint)


__all__ = ["HookPoint", "LensHandle", "hooks_version", "is_hook_point"]
