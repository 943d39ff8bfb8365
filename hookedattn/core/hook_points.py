"""Hook points and the hook system (TransformerLens's `HookPoint` and `HookedRootModule`).

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

import contextlib
import dataclasses
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

from torch import Tensor, nn

from hookedattn.core import _torch_hooks
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

    def __init__(self) -> None:
        super().__init__()
        self.name: str = "<unnamed hook point>"
        self.ctx: dict[str, Any] = {}
        self._fwd: list[LensHandle] = []
        self._bwd: list[LensHandle] = []
        self._active = False
        self._needs_value = False
        self._listening = False  # a hook that is not a cache's (`HookedRootModule.is_listened`)
        # A forward installed on this instance (nnsight's): reached through nn.Module.__call__.
        self._wrapped = False

    def __call__(self, x: Tensor) -> Tensor:
        # The fast path: with no hook attached, a hook point is a single attribute test.
        if not self._active:
            return x
        if self._wrapped:
            return nn.Module.__call__(self, x)  # the instance's forward, which calls ours
        return self._run_hooks(x)

    def forward(self, x: Tensor) -> Tensor:
        """`x` after this point's hooks: what a forward installed on the instance wraps."""
        return self._run_hooks(x)

    @property
    def is_active(self) -> bool:
        """Whether any hook (forward or backward, of any scope) is attached here now, or a
        forward installed on the instance (nnsight's) may read or replace the value."""
        return self._active

    @property
    def needs_value(self) -> bool:
        """Whether a hook here needs the value in this forward: what the kernels read to
        decide whether an activation that exists only written out must be computed. False
        where every hook can take it later (`kernels.defer`)."""
        return self._needs_value

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
        object.__setattr__(self, "_active", wrapped or bool(handles))
        needs_value = wrapped or any(h.defers_to is None for h in handles)
        object.__setattr__(self, "_needs_value", needs_value)
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


class HookedRootModule(nn.Module):
    """A module whose `HookPoint`s are named and addressable by name or by filter.

    Subclasses build their modules, then call `setup()`, which names every hook point
    after its path (`blocks.0.attn.hook_q`) and fills `hook_dict` and `mod_dict`.
    """

    hook_dict: dict[str, HookPoint]
    mod_dict: dict[str, nn.Module]

    def setup(self) -> None:
        """Name every hook point by its module path and index them."""
        self.mod_dict = {}
        self.hook_dict = {}
        for name, module in self.named_modules():
            if name == "":
                continue
            self.mod_dict[name] = module
            if isinstance(module, HookPoint):
                module.name = name
                self.hook_dict[name] = module
        # Reading a submodule off its parent costs more than an idle hook point or a small
        # product: it lives in `_modules`, reached through nn.Module.__getattr__ (Python)
        # after the ordinary lookup fails. A copy of the reference in the parent's instance
        # dict is found first. nn.Module.__setattr__ drops the copy when the attribute is
        # reassigned (`block.mlp = MyMLP()`); a submodule put in place otherwise
        # (`add_module` over an existing name) is read through the copy until `setup()`
        # runs again and refreshes it.
        for module in self.modules():
            for child_name, child in module._modules.items():
                if child is not None and child_name.isidentifier():
                    module.__dict__[child_name] = child
        # What `is_listened` reads: the torch hooks of every module but the root and the
        # hook points (torch hooks on the root run once around a forward whatever it does
        # inside), each module's hook dicts replaced by ones that count their changes.
        watched = [m for m in self.modules() if not isinstance(m, HookPoint)][1:]
        _torch_hooks.watch(watched)
        self.__dict__["_watched"] = watched
        self.__dict__["_listened_at"] = (-1, -1, False)
        self.__dict__["_wrapped_seen"] = None  # the hook points are asked at the next forward

    def _notice_wrappers(self) -> None:
        """Let every hook point follow whether a forward is installed on it (the module
        docstring). nnsight's `NNsight(model)` installs one on every module at once, the
        model's own included, so the hook points are asked again only when the model's own
        forward has changed (or `setup()` ran): one dict lookup per forward otherwise.
        Forwards call this before their first hook point."""
        wrapped = "forward" in self.__dict__
        if wrapped is not self.__dict__.get("_wrapped_seen"):
            for point in self.hook_dict.values():
                point._notice_wrapper()
            self.__dict__["_wrapped_seen"] = wrapped

    def is_listened(self) -> bool:
        """Whether anything could act on a forward's inner steps now: a hook on any hook
        point other than a cache's recording hook (which keeps the last value it sees at
        each name, so a second run only records again), a forward installed on a hook
        point (nnsight's: `_notice_wrappers`), or a torch hook (forward or
        backward) on any module below the root, or a global one. Where nothing listens, a
        forward may run a step twice unseen (the kernels' deferred guard). The hook points
        are asked again only after a hook was attached or removed somewhere
        (`hooks_version`), the modules only after a torch hook was (their hook dicts count
        it: `_torch_hooks.watch`); modules assigned after `setup()` are watched once `setup()`
        runs again."""
        self._notice_wrappers()
        version, torch_version, hooked = self._listened_at
        if version != _version or torch_version != _torch_hooks.version():
            hooked = any(point._listening for point in self.hook_dict.values())
            hooked = hooked or _torch_hooks.hooked(self._watched)
            self.__dict__["_listened_at"] = (_version, _torch_hooks.version(), hooked)
        return hooked or _torch_hooks.global_hooks()

    def hook_points(self) -> list[HookPoint]:
        """Every hook point, in the order the forward pass reaches them."""
        return list(self.hook_dict.values())

    # ----------------------------------------------------------------- attaching
    def add_hook(
        self,
        name: NameOrFilter,
        hook: HookFn,
        dir: Direction = "fwd",
        is_permanent: bool = False,
        prepend: bool = False,
    ) -> list[LensHandle]:
        """Attach `hook` at the hook point `name`, or at every point a filter accepts.

        Returns the handles, one per hook point reached; an unknown name is a `KeyError`
        naming the closest valid names, raised before anything is attached.
        """
        points = self._resolve(name)
        return [p.add_hook(hook, dir, is_permanent, prepend) for p in points]

    def add_perma_hook(self, name: NameOrFilter, hook: HookFn, dir: Direction = "fwd"):
        """Attach a hook that `reset_hooks()` keeps (TransformerLens's `add_perma_hook`)."""
        return self.add_hook(name, hook, dir, is_permanent=True)

    def reset_hooks(self, including_permanent: bool = False, clear_contexts: bool = True):
        """Detach every hook (and permanent ones too if asked); clear hook contexts."""
        for point in self.hook_dict.values():
            point.remove_hooks("both", including_permanent=including_permanent)
            if clear_contexts:
                point.clear_context()

    def remove_all_hook_fns(self, direction="both", including_permanent=False) -> None:
        """TransformerLens's name for detaching hooks without clearing contexts."""
        for point in self.hook_dict.values():
            point.remove_hooks(direction, including_permanent=including_permanent)

    def clear_contexts(self) -> None:
        """Empty every hook point's `ctx`."""
        for point in self.hook_dict.values():
            point.clear_context()

    def attached_hooks(self) -> list[LensHandle]:
        """Every hook attached anywhere in the model (permanent ones included)."""
        return [h for p in self.hook_dict.values() for h in (*p._fwd, *p._bwd)]

    @contextlib.contextmanager
    def hooks(
        self,
        fwd_hooks: Sequence = (),  # of (name_or_filter, fn) pairs; checked by _pairs
        bwd_hooks: Sequence = (),
        reset_hooks_end: bool = True,
        clear_contexts: bool = False,
    ) -> Iterator["HookedRootModule"]:
        """Attach hooks for the duration of a `with` block.

        Levels nest: on exit each level detaches only the hooks it attached, also when the
        block raises. With `reset_hooks_end=False` the hooks stay attached after the block.
        All names are checked before anything is attached.

        The hooks belong to this thread: a forward in another thread that reaches them
        raises (see the module docstring); with `reset_hooks_end=False` they become the
        model's, as if attached with `add_hook`. A hook attached with `add_hook` inside the
        block is the model's too: it stays attached after the block, until removed or
        `reset_hooks()`.
        """
        planned = [
            (point, fn, dir)
            for dir, pairs in (("fwd", fwd_hooks), ("bwd", bwd_hooks))
            for name, fn in _pairs(pairs, dir)
            for point in self._resolve(name)
        ]
        thread = threading.get_ident() if reset_hooks_end else None
        handles = [point.add_hook(fn, dir, _thread=thread) for point, fn, dir in planned]
        try:
            yield self
        finally:
            if reset_hooks_end:
                for handle in handles:
                    handle.remove()
            if clear_contexts:
                self.clear_contexts()

    def run_with_hooks(
        self,
        *model_args: Any,
        fwd_hooks: Sequence = (),  # of (name_or_filter, fn) pairs; checked by _pairs
        bwd_hooks: Sequence = (),
        reset_hooks_end: bool = True,
        clear_contexts: bool = False,
        **model_kwargs: Any,
    ) -> Any:
        """Run the forward with hooks attached, and detach them afterwards.

        Backward hooks are attached to the graph of this forward, so calling `.backward()`
        on the output afterwards still reaches them.
        """
        with self.hooks(fwd_hooks, bwd_hooks, reset_hooks_end, clear_contexts):
            return self(*model_args, **model_kwargs)

    # ----------------------------------------------------------------- resolving
    def hook_points_for(self, names: Any) -> list[HookPoint]:
        """The hook points `names` selects, in forward order where a predicate chooses them:
        None (every one), a full or short name (`"blocks.0.attn.hook_z"`, `"resid_pre"`
        with its layer expanded by `names.get_act_name`), a list of names, or a predicate
        on full names. An unknown name is a `KeyError` naming the closest valid ones.

        The one resolver of hook names: `add_hook`, `hooks()`, `run_with_hooks` and
        `run_with_cache(names_filter=)` all select through it.
        """
        if names is None:
            return list(self.hook_dict.values())
        if callable(names):
            return [p for n, p in self.hook_dict.items() if names(n)]
        if isinstance(names, str):
            names = [names]
        if not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
            raise TypeError(
                f"hook points are chosen by None (all), a name, a list of names or a "
                f"predicate on names, got {names!r}"
            )
        points = []
        for name in names:
            full = _names.get_act_name(name) if "." not in name else name
            if full not in self.hook_dict:
                raise KeyError(_names.unknown_name_message(name, self.hook_dict))
            points.append(self.hook_dict[full])
        return points

    def _resolve(self, name: NameOrFilter) -> list[HookPoint]:
        # A hook's target: one name or a predicate (None would attach everywhere by accident).
        if name is None or not (isinstance(name, str) or callable(name)):
            raise TypeError(
                f"a hook target is a hook name or a filter function of names, got {name!r}"
            )
        return self.hook_points_for(name)


def _pairs(pairs: Sequence, dir: str) -> list[tuple[NameOrFilter, HookFn]]:
    """Validate a list of `(name_or_filter, fn)` pairs before any hook is attached."""
    if isinstance(pairs, tuple) and len(pairs) == 2 and callable(pairs[1]):
        raise TypeError(f"{dir}_hooks must be a list of (name, fn) pairs, not one pair")
    out = []
    for pair in pairs:
        if not (isinstance(pair, tuple | list) and len(pair) == 2 and callable(pair[1])):
            raise TypeError(
                f"each of {dir}_hooks must be a (name_or_filter, fn) pair, got {pair!r}"
            )
        out.append((pair[0], pair[1]))
    return out


def is_hook_point(module: nn.Module) -> bool:
    """Whether `module` is a `HookPoint`."""
    return isinstance(module, HookPoint)


__all__ = ["HookPoint", "HookedRootModule", "LensHandle", "hooks_version", "is_hook_point"]
