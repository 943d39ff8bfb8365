"""`assert_no_hooks`: nothing left attached to a model, and if something is, what and where.

A hook left attached after an experiment silently edits every later forward of that model,
which in a test suite means every later test that shares it.
"""

import functools
from collections.abc import Sequence
from pathlib import Path

from hookedattn.core.hook_points import LensHandle
from hookedattn.core.hooked_root import HookedRootModule

_HOW_TO_DETACH = (
    "Attach hooks with `with model.hooks(fwd_hooks=...)` or `model.run_with_hooks(...)`, "
    "which detach them on exit, or call `model.reset_hooks()` "
    "(`reset_hooks(including_permanent=True)` for permanent ones)."
)


def assert_no_hooks(model: HookedRootModule, *, allow_permanent: bool = False) -> None:
    """Assert that no hook is attached anywhere in `model`.

    With `allow_permanent=True`, hooks attached with `is_permanent=True` (or
    `add_perma_hook`) are allowed. The `AssertionError` lists every hook left: its
    direction, function, where the function is defined, and the hook point it is on.
    """
    if not isinstance(model, HookedRootModule):
        raise TypeError(f"model must be a HookedRootModule, got {type(model).__name__}")
    left = [h for h in model.attached_hooks() if not (allow_permanent and h.is_permanent)]
    if left:
        raise AssertionError(
            f"{len(left)} hook{'s' if len(left) > 1 else ''} left attached to "
            f"{type(model).__name__}:\n{describe_handles(left)}\n{_HOW_TO_DETACH}"
        )


def describe_handles(handles: Sequence[LensHandle]) -> str:
    """One line per hook: `fwd hook ablate (tests/test_x.py:12) at blocks.0.attn.hook_z`."""
    lines = []
    for handle in handles:
        kind = "permanent " if handle.is_permanent else ""
        kind += "caching " if handle.is_cache else ""
        lines.append(
            f"  {kind}{handle.dir} hook {_describe_fn(handle.fn)} at {handle.hook_point.name}"
        )
    return "\n".join(lines)


def _describe_fn(fn: object) -> str:
    inner = fn.func if isinstance(fn, functools.partial) else fn
    name = getattr(inner, "__qualname__", None) or type(inner).__name__
    if isinstance(fn, functools.partial):
        name = f"partial({name})"
    code = getattr(inner, "__code__", None)
    if code is None:
        return name
    path = Path(code.co_filename)
    if path.is_relative_to(Path.cwd()):
        path = path.relative_to(Path.cwd())
    return f"{name} ({path}:{code.co_firstlineno})"
