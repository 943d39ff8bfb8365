"""TransformerLens's `hook_points` module: our `HookPoint` and `HookedRootModule`.

The same classes as `hookedattn.core.hook_points` (hook points cost nothing while idle, and a
backward hook is attached to the graph when the forward runs; see there).
"""

from hookedattn.core.hook_points import HookedRootModule, HookPoint, LensHandle

__all__ = ["HookPoint", "HookedRootModule", "LensHandle"]
