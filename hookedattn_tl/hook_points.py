"""TransformerLens's `hook_points` module: our `HookPoint`, with TL's hook levels and handles.

The hook point is `hookedattn.core.hook_points.HookPoint` (free while idle; a backward hook
is attached to the graph when the forward runs). This subclass adds what TL 3.5 code reads
and passes: `add_hook(..., level=)` and `has_hooks(level=)` / `remove_hooks(level=)` (the
nesting depth of the `hooks()` context that attached a hook), handles with `context_level`
and `user_hook`, a tensor conversion around the hooks (`enable_reshape`), and TL's `repr`.
The facade's models use this class for every hook point they build.

`HookedRootModule` lives in `hookedattn_tl.HookedRootModule`, as in TL 3.x; importing it
from here still works, with TL's DeprecationWarning.
"""

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Literal

from torch import Tensor

from hookedattn.core import hook_points as _core

HookFunction = Callable[..., Any]
NamesFilter = Callable[[str], bool] | Sequence[str] | str | None
DeviceType = Any
Direction = Literal["fwd", "bwd"]


@dataclasses.dataclass(eq=False)
class LensHandle(_core.LensHandle):
    """A hook attached to a hook point, as TL's `LensHandle` reads: `is_permanent`,
    `context_level` (None outside a `hooks()` context), `user_hook` (the function given),
    and `hook.remove()`."""

    context_level: int | None = None
    user_hook: HookFunction | None = None

    @property
    def hook(self) -> "LensHandle":
        """TL's handle wraps torch's `RemovableHandle` here; ours removes itself."""
        return self


class HookPoint(_core.HookPoint):
    """`hookedattn`'s hook point with TL 3.5's hook levels, conversions and handles."""

    # Class attributes, not set in __init__: the facade's models turn the core hook points
    # they build into this class in place (`__class__`), without running a constructor.
    hook_conversion: Any = None
    backward_scale: float = 1.0

    def __init__(self) -> None:
        super().__init__()
        self.name = None  # TL's unnamed hook point

    def add_hook(
        self,
        hook: HookFunction,
        dir: Direction = "fwd",
        is_permanent: bool = False,
        level: int | None = None,
        prepend: bool = False,
        alias_names: list[str] | None = None,
        *,
        _is_cache: bool = False,
        _thread: int | None = None,
    ) -> LensHandle:
        """Attach `hook` (`fn(activation, hook=...)`) in direction `dir`, at context `level`.

        With `enable_reshape(conversion)`, the hook sees `conversion.convert(activation)` and
        what it returns goes back through `conversion.revert`. Returns the handle (TL returns
        None; the handle is also in `fwd_hooks` / `bwd_hooks`).
        """
        if alias_names is not None:
            raise ValueError(
                "alias_names is TransformerBridge's per-hook-point list of alias names; here a "
                "TransformerBridge answers TL 4's names through its hook_dict "
                "(hookedattn_tl.model_bridge.hook_names): attach the hook at each name "
                f"instead (got {alias_names!r})"
            )
        if dir not in ("fwd", "bwd"):
            raise ValueError(f"dir must be 'fwd' or 'bwd', got {dir!r}")
        if not callable(hook):
            raise TypeError(f"a hook must be callable, got {type(hook).__name__}")
        handle = LensHandle(
            self,
            hook if self.hook_conversion is None else _Converted(hook, self),
            dir,
            is_permanent,
            _is_cache,
            _thread,
            context_level=level,
            user_hook=hook,
        )
        hooks = self._fwd if dir == "fwd" else self._bwd
        hooks.insert(0, handle) if prepend else hooks.append(handle)
        self._update_active()
        return handle

    def add_perma_hook(self, hook: HookFunction, dir: Direction = "fwd") -> None:
        """Attach a hook that `remove_hooks()` keeps unless told `including_permanent`."""
        self.add_hook(hook, dir=dir, is_permanent=True)

    def has_hooks(
        self,
        dir: Literal["fwd", "bwd", "both"] = "both",
        including_permanent: bool = True,
        level: int | None = None,
    ) -> bool:
        """Whether a hook matching direction, permanence and context `level` is attached."""
        return any(self._matching(dir, including_permanent, level))

    def remove_hooks(
        self,
        dir: Literal["fwd", "bwd", "both"] = "fwd",
        including_permanent: bool = False,
        level: int | None = None,
    ) -> None:
        """Detach the hooks in direction `dir` (TL's rule: `including_permanent` removes every
        one; otherwise the non-permanent ones at `level`, or at any level if None)."""
        for handle in [*self._fwd, *self._bwd]:
            if dir not in ("both", handle.dir):
                continue
            at_level = level is None or getattr(handle, "context_level", None) == level
            if including_permanent or (not handle.is_permanent and at_level):
                self._remove(handle)

    def enable_reshape(self, hook_conversion: Any = None) -> None:
        """Pass activations through `hook_conversion.convert` before every hook here, and
        what a hook returns through `hook_conversion.revert` (None to stop)."""
        self.hook_conversion = hook_conversion
        for handle in (*self._fwd, *self._bwd):
            user_hook = getattr(handle, "user_hook", None) or handle.fn
            handle.fn = user_hook if hook_conversion is None else _Converted(user_hook, self)
        self._update_active()  # the hooks here changed: what a decode step decided is stale

    def _matching(self, dir: str, including_permanent: bool, level: int | None):
        for handle in (*self._fwd, *self._bwd):
            if dir not in ("both", handle.dir):
                continue
            if not including_permanent and handle.is_permanent:
                continue
            if level is not None and getattr(handle, "context_level", None) != level:
                continue
            yield handle

    def __repr__(self) -> str:
        bits = [f"name={self.name!r}"] if self.name is not None else []
        bits += [f"{len(self._fwd)} fwd"] if self._fwd else []
        bits += [f"{len(self._bwd)} bwd"] if self._bwd else []
        return f"HookPoint({', '.join(bits)})"


@dataclasses.dataclass(frozen=True)
class _Converted:
    """A user's hook seen through its hook point's conversion (when one is set at call time)."""

    fn: HookFunction
    hook_point: HookPoint

    @property
    def __name__(self) -> str:  # the name errors and `repr`s show: the user's function's
        return getattr(self.fn, "__name__", repr(self.fn))

    def __call__(self, activation: Tensor, hook: Any) -> Any:
        conversion = getattr(self.hook_point, "hook_conversion", None)
        if conversion is None:
            return self.fn(activation, hook=hook)
        out = self.fn(conversion.convert(activation), hook=hook)
        return None if out is None else conversion.revert(out)


class HookIntrospectionMixin:
    """TL's `list_hooks()`, for any class with a `hook_dict` of hook points."""

    def list_hooks(
        self,
        name_filter: NamesFilter = None,
        dir: Literal["fwd", "bwd", "both"] = "both",
        including_permanent: bool = True,
    ) -> dict[str, list[_core.LensHandle]]:
        """The attached hooks by hook name (points without hooks left out); `name_filter` is
        None, a name, a list of names or a predicate."""
        if name_filter is None:
            matches: Callable[[str], bool] = lambda name: True
        elif callable(name_filter):
            matches = name_filter
        elif isinstance(name_filter, str):
            matches = lambda name: name == name_filter
        else:
            allowed = set(name_filter)
            matches = lambda name: name in allowed
        out = {}
        for name, point in self.hook_dict.items():
            if not matches(name):
                continue
            handles = [
                *(point.fwd_hooks if dir in ("fwd", "both") else ()),
                *(point.bwd_hooks if dir in ("bwd", "both") else ()),
            ]
            handles = [h for h in handles if including_permanent or not h.is_permanent]
            if handles:
                out[name] = handles
        return out


def __getattr__(name: str) -> Any:
    # TL 3.x moved HookedRootModule to its own module and warns on the old path.
    if name == "HookedRootModule":
        from hookedattn_tl.HookedRootModule import HookedRootModule

        warnings.warn(
            "Importing HookedRootModule from transformer_lens.hook_points is deprecated; "
            "import it from transformer_lens (hookedattn_tl) or "
            "transformer_lens.HookedRootModule instead.",
            DeprecationWarning,
            stacklevel=2,
        )
        return HookedRootModule
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["HookIntrospectionMixin", "HookPoint", "LensHandle"]
