"""A module called as cheaply as its forward while no torch hook can see the call.

`nn.Module.__call__` runs two Python frames and a dozen checks (torch hooks on the module and
global ones, TorchScript tracing, `module.compile()`) before the forward: about ten times
the cost of calling `forward` itself. A generated token on a small model makes a dozen such
calls (each block, its attention, MLP and norms, the embeddings, the unembedding) and is
mostly fixed costs of this kind.

`install(modules)` gives each of hookedattn's module classes among `modules` that keeps
nn.Module's `__call__` the `__call__` below: `forward` at once where the module has no torch
hook of its own (`register_forward_hook` and the like), no global one
(`register_module_forward_hook`), no compiled call (`module.compile()`) and no TorchScript
trace is running; otherwise nn.Module's own, so every hook runs as before. A forward set on
an instance (nnsight's) is the one called either way. Classes outside hookedattn, and those
with a `__call__` of their own (hook points, norms), are left alone, and so are the roots
(`HookedRootModule`: they are called once a forward, and `torch.compile` of a
`run_with_cache` lost the cache's hooks when the root was called this way).
"""

from collections.abc import Iterable

import torch
from torch import nn
from torch.nn.modules import module as _torch_module

# Torch's global hook dicts: kept by reference (torch adds to and removes from them in place).
_GLOBAL_HOOKS = (
    _torch_module._global_forward_hooks,
    _torch_module._global_forward_pre_hooks,
    _torch_module._global_backward_hooks,
    _torch_module._global_backward_pre_hooks,
)
_tracing_state = torch._C._get_tracing_state


def quiet_call(self: nn.Module, *args: object, **kwargs: object) -> object:
    """`self.forward(*args, **kwargs)`, or nn.Module's `__call__` where a torch hook, a
    compiled call or a TorchScript trace could see the call (module docstring)."""
    if (
        self._forward_hooks
        or self._forward_pre_hooks
        or self._backward_hooks
        or self._backward_pre_hooks
        or self._compiled_call_impl is not None
        or _GLOBAL_HOOKS[0]
        or _GLOBAL_HOOKS[1]
        or _GLOBAL_HOOKS[2]
        or _GLOBAL_HOOKS[3]
        or _tracing_state()
    ):
        return nn.Module.__call__(self, *args, **kwargs)
    return self.forward(*args, **kwargs)


def install(modules: Iterable[nn.Module]) -> None:
    """`quiet_call` as the `__call__` of each hookedattn module class among `modules` that
    keeps nn.Module's (module docstring)."""
    for module in modules:
        cls = type(module)
        if cls.__module__.startswith("hookedattn") and cls.__call__ is nn.Module.__call__:
            cls.__call__ = quiet_call
