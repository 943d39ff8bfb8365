"""TransformerLens's `HookedRootModule`: ours, with TL 3.5's hook levels and method signatures.

`hookedattn.core.hooked_root.HookedRootModule` names and attaches hooks; this subclass adds
what TL code calls on a root module: `context_level` (the depth of nested `hooks()`
contexts, each of which detaches only the hooks it attached), `add_hook(..., level=)`,
`reset_hooks(clear_contexts, direction, including_permanent, level)` in TL's argument
order, `list_hooks`, `check_hooks_to_add`, `add_caching_hooks`, and the `_enable_hook*`
internals TL code calls. Every hook point it names becomes a `hookedattn_tl.HookPoint`.
"""

import contextlib
import functools
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Literal

from torch import Tensor

from hookedattn.core import _recording
from hookedattn.core import hook_points as _core
from hookedattn.core.hooked_root import HookedRootModule as _CoreRoot
from hookedattn_tl.hook_points import (
    HookFunction,
    HookIntrospectionMixin,
    HookPoint,
    LensHandle,
    NamesFilter,
)

Direction = Literal["fwd", "bwd"]
Directions = Literal["fwd", "bwd", "both"]


class HookedRootModule(HookIntrospectionMixin, _CoreRoot):
    """A module whose hook points are named and addressable, with TL's hook API."""

    # Class defaults: a subclass need not call this class's __init__ (TL's does, ours may not).
    context_level: int = 0
    is_caching: bool = False

    def __init__(self, *args: Any) -> None:
        super().__init__()
        self.context_level = 0
        self.is_caching = False

    def setup(self) -> None:
        """Name every hook point by its path and index them (`hook_dict`, `mod_dict`); each
        becomes a `hookedattn_tl.HookPoint`."""
        for module in self.modules():
            if type(module) is _core.HookPoint:
                module.__class__ = HookPoint  # the same object and state, TL's methods added
        super().setup()

    # ----------------------------------------------------------------- attaching
    def add_hook(
        self,
        name: str | Callable[[str], bool],
        hook: HookFunction,
        dir: Direction = "fwd",
        is_permanent: bool = False,
        level: int | None = None,
        prepend: bool = False,
    ) -> list[LensHandle]:
        """Attach `hook` at the point `name` (or every point a predicate accepts), after
        `check_hooks_to_add`; returns the handles."""
        handles = []
        for point in self._resolve(name):
            self.check_hooks_to_add(point, point.name, hook, dir, is_permanent, prepend)
            handles.append(
                point.add_hook(
                    hook, dir=dir, is_permanent=is_permanent, level=level, prepend=prepend
                )
            )
        return handles

    def add_perma_hook(
        self, name: str | Callable[[str], bool], hook: HookFunction, dir: Direction = "fwd"
    ) -> list[LensHandle]:
        """Attach a hook that `reset_hooks()` keeps unless told `including_permanent`."""
        return self.add_hook(name, hook, dir=dir, is_permanent=True)

    def check_and_add_hook(
        self,
        hook_point: HookPoint,
        hook_point_name: str,
        hook: HookFunction,
        dir: Direction = "fwd",
        is_permanent: bool = False,
        level: int | None = None,
        prepend: bool = False,
    ) -> None:
        """`check_hooks_to_add`, then attach the hook to `hook_point`."""
        self.check_hooks_to_add(hook_point, hook_point_name, hook, dir, is_permanent, prepend)
        hook_point.add_hook(hook, dir=dir, is_permanent=is_permanent, level=level, prepend=prepend)

    def check_hooks_to_add(
        self,
        hook_point: HookPoint,
        hook_point_name: str,
        hook: HookFunction,
        dir: Direction = "fwd",
        is_permanent: bool = False,
        prepend: bool = False,
    ) -> None:
        """Override to refuse hooks before they are attached; accepts every hook here."""

    def remove_all_hook_fns(
        self,
        direction: Directions = "both",
        including_permanent: bool = False,
        level: int | None = None,
    ) -> None:
        """Detach hooks in `direction` (at context `level` if given; permanent ones only
        with `including_permanent`)."""
        for point in self.hook_dict.values():
            if isinstance(point, HookPoint):
                point.remove_hooks(direction, including_permanent=including_permanent, level=level)
            else:
                point.remove_hooks(direction, including_permanent=including_permanent)

    def reset_hooks(
        self,
        clear_contexts: bool = True,
        direction: Directions = "both",
        including_permanent: bool = False,
        level: int | None = None,
    ) -> None:
        """TL's `reset_hooks`: clear the hook contexts (by default) and detach the hooks."""
        if clear_contexts:
            self.clear_contexts()
        self.remove_all_hook_fns(direction, including_permanent, level=level)
        self.is_caching = False

    def _enable_hook_with_name(self, name: str, hook: Callable, dir: Direction) -> None:
        """Attach `hook` at `mod_dict[name]`, at the current context level."""
        module = self.mod_dict[name]
        if not hasattr(module, "add_hook"):
            raise TypeError(f"{name!r} is a {type(module).__name__}, not a hook point")
        module.add_hook(hook, dir=dir, level=self.context_level)

    def _enable_hooks_for_points(
        self,
        hook_points: Iterable[tuple[str, HookPoint]],
        enabled: Callable[[str], bool],
        hook: Callable,
        dir: Direction,
    ) -> None:
        """Attach `hook` at every point of `hook_points` whose name `enabled` accepts."""
        for name, point in hook_points:
            if enabled(name):
                point.add_hook(hook, dir=dir, level=self.context_level)

    def _enable_hook(self, name: str | Callable[[str], bool], hook: Callable, dir: Direction):
        """Attach `hook` at the point `name`, or at every point a predicate accepts."""
        if isinstance(name, str):
            self._enable_hook_with_name(name=name, hook=hook, dir=dir)
        else:
            self._enable_hooks_for_points(self.hook_dict.items(), name, hook, dir)

    @contextlib.contextmanager
    def hooks(
        self,
        fwd_hooks: Sequence = (),
        bwd_hooks: Sequence = (),
        reset_hooks_end: bool = True,
        clear_contexts: bool = False,
    ) -> Iterator["HookedRootModule"]:
        """Attach hooks for a `with` block, one context level deeper (`context_level`).

        As the core's `hooks()` (names checked before anything is attached; on exit each
        level detaches only the hooks it attached), and each handle records the level.
        """
        self.context_level += 1
        before = {id(handle) for handle in self.attached_hooks()}
        try:
            with super().hooks(fwd_hooks, bwd_hooks, reset_hooks_end, clear_contexts) as model:
                for handle in self.attached_hooks():
                    if id(handle) not in before and isinstance(handle, LensHandle):
                        handle.context_level = self.context_level
                yield model
        finally:
            self.context_level -= 1

    def run_with_hooks(
        self,
        *model_args: Any,
        fwd_hooks: Sequence = (),
        bwd_hooks: Sequence = (),
        reset_hooks_end: bool = True,
        clear_contexts: bool = False,
        **model_kwargs: Any,
    ) -> Any:
        """Run the forward with hooks attached for this call (see `hooks()`)."""
        with self.hooks(fwd_hooks, bwd_hooks, reset_hooks_end, clear_contexts):
            return self(*model_args, **model_kwargs)

    def run_with_cache(
        self,
        *model_args: Any,
        names_filter: NamesFilter = None,
        device: Any = None,
        remove_batch_dim: bool = False,
        incl_bwd: bool = False,
        pos_slice: Any = None,
        **model_kwargs: Any,
    ) -> tuple[Any, Any]:
        """`(output, cache)` of a forward of any root module (TL's `HookedRootModule` has
        it, for models of your own); the cache maps each chosen hook name to its value.
        `hookedattn_tl.HookedTransformer` returns TL's `ActivationCache` instead."""
        return _recording.run_with_cache(
            self,
            model_args,
            model_kwargs,
            names_filter=names_filter,
            device=device,
            remove_batch_dim=remove_batch_dim,
            incl_bwd=incl_bwd,
            pos_slice=pos_slice,
        )

    def add_caching_hooks(
        self,
        names_filter: NamesFilter = None,
        incl_bwd: bool = False,
        device: Any = None,
        remove_batch_dim: bool = False,
        cache: dict | None = None,
    ) -> dict:
        """Attach hooks that store each chosen activation (and gradient, `name + "_grad"`,
        with `incl_bwd`) into `cache`, detached; they stay until `reset_hooks()`."""
        cache = {} if cache is None else cache
        chosen = self.hook_points_for(names_filter)
        self.is_caching = True

        def save(tensor: Tensor, hook: HookPoint, is_backward: bool) -> None:
            name = hook.name + ("_grad" if is_backward else "")
            saved = tensor.detach().to(device)
            cache[name] = saved[0] if remove_batch_dim else saved

        for point in chosen:
            point.add_hook(functools.partial(save, is_backward=False), "fwd")
            if incl_bwd:
                point.add_hook(functools.partial(save, is_backward=True), "bwd")
        return cache

    def cache_all(self, cache: dict, incl_bwd: bool = False, device: Any = None) -> None:
        """TL 2's `cache_all`: `add_caching_hooks` on every hook point, into `cache`."""
        logging.warning("cache_all is deprecated in TransformerLens; use add_caching_hooks")
        self.add_caching_hooks(None, incl_bwd, device, cache=cache)


__all__ = ["HookedRootModule"]
