"""Whether torch hooks are registered on a model's modules, known without walking them.

A hook point skips `nn.Module.__call__` while idle, so a torch hook (`register_forward_hook`
and the like) on a module below it would never be seen by the model's idle-point fast
path. `HookedRootModule.is_listened` therefore asks whether any torch hook is registered
below the root; `watch` replaces each module's hook dicts by ones that count their changes
(`version`), so the answer is recomputed (`hooked`) only after a hook was registered or
removed somewhere. Global torch hooks (`register_module_forward_hook`) are asked each time
(`global_hooks`: four dict lookups).
"""

import collections
import itertools
from typing import Any

from torch import nn

# A module's dicts of torch hooks (`register_forward_hook` and the like add to them).
_TORCH_HOOK_DICTS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
)
_CHANGES = itertools.count(1)
_version = 0  # bumped whenever a watched module's torch hooks change


def version() -> int:
    """A number that changes whenever a torch hook is registered on or removed from a
    watched module."""
    return _version


class _WatchedHooks(collections.OrderedDict):
    """A watched module's dict of torch hooks: each hook registered or removed (torch adds
    one by key and removes it with `del`) bumps `version()`."""

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        _changed()

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)
        _changed()


def _changed() -> None:
    global _version
    _version = next(_CHANGES)


def watch(modules: list[nn.Module]) -> None:
    """Make each of `modules` count its torch hooks' changes (idempotent)."""
    for module in modules:
        for field in _TORCH_HOOK_DICTS:
            hooks = module.__dict__[field]
            if not isinstance(hooks, _WatchedHooks):
                module.__dict__[field] = _WatchedHooks(hooks)


def hooked(modules: list[nn.Module]) -> bool:
    """Whether a torch hook (forward or backward) is registered on one of `modules`."""
    return any(getattr(m, field) for m in modules for field in _TORCH_HOOK_DICTS)


def global_hooks() -> bool:
    """Whether a torch hook is registered for every module (`register_module_forward_hook`
    and the like)."""
    from torch.nn.modules import module

    return bool(
        module._global_forward_hooks
        or module._global_forward_pre_hooks
        or module._global_backward_hooks
        or module._global_backward_pre_hooks
    )
