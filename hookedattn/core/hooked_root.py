"""The root of a model built from hook points (TransformerLens's `HookedRootModule`).

`setup()` names every `HookPoint` after its module path (`blocks.0.attn.hook_q`) and indexes
them; hooks are then attached by name or by filter of names, for good (`add_hook`) or for a
scope (`hooks()`, `run_with_hooks`), and `is_listened` says whether anything could act on a
forward's inner steps (what the kernels' deferred checks read). What a hook is, how it runs
and which thread it belongs to: `hook_points`. (TransformerLens's path for this class,
`hook_points.HookedRootModule`, is the facade's: `hookedattn_tl.hook_points`.)
"""

import contextlib
import threading
from collections.abc import Iterator, Sequence
from typing import Any

from torch import nn

from hookedattn.core import _module_calls, _parameter_reads, _torch_hooks, _variants
from hookedattn.core import names as _names
from hookedattn.core.hook_points import (
    Direction,
    HookFn,
    HookPoint,
    LensHandle,
    NameOrFilter,
    hooks_version,
)


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
        # No module refers back to itself (a root keeps its class: `type(model)` is what
        # code compares; it keeps its chosen steps as functions of itself instead).
        _variants.keep_on_classes(m for m in self.modules() if not isinstance(m, HookedRootModule))
        _parameter_reads.install(self)  # a parameter read without nn.Module.__getattr__
        # A component's call without nn.Module.__call__ where no torch hook could see it.
        _module_calls.install(m for m in self.modules() if not isinstance(m, HookedRootModule))
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
        if version != hooks_version() or torch_version != _torch_hooks.version():
            hooked = any(point._listening for point in self.hook_dict.values())
            hooked = hooked or _torch_hooks.hooked(self._watched)
            self.__dict__["_listened_at"] = (hooks_version(), _torch_hooks.version(), hooked)
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
