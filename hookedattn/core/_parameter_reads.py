"""A parameter read as cheaply as a plain attribute.

nn.Module keeps its parameters in `_parameters`, where `module.W_Q` reaches them only
through nn.Module.__getattr__ (Python), called after the ordinary lookup has failed: about
six times the cost of a property. A forward reads a few parameters per sublayer, and a
generated token on a small model is mostly such fixed costs.

`install(root)` gives each of hookedattn's module classes under `root`, for each parameter
name its instances hold, a `ParameterRead`: a class attribute that reads `_parameters`
directly. It keeps nothing itself: the parameter stays where torch keeps it, so assigning
or deleting one, `load_state_dict(assign=True)`, and `torch.func.functional_call` (which
swaps the entries of `_parameters`) are all read through it. It defines no `__set__`, so an
instance attribute of the same name still wins, and a name a module does not hold as a
parameter falls through to nn.Module.__getattr__ (a buffer, a submodule, or its error).
Classes that define the name already (a property such as grouped attention's `W_K`) and
classes outside hookedattn are left alone.
"""

from typing import Any

from torch import nn


class ParameterRead:
    """The parameter `name` of a module, read from its `_parameters` (module docstring)."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, module: Any, owner: type | None = None) -> Any:
        if module is None:
            return self
        try:
            return module._parameters[self.name]
        except (AttributeError, KeyError):
            raise AttributeError(self.name) from None  # nn.Module.__getattr__ takes over


def install(root: nn.Module) -> None:
    """A `ParameterRead` on each hookedattn module class under `root` for each parameter
    name its instances there hold, where the class does not define the name already."""
    for module in root.modules():
        cls = type(module)
        if not cls.__module__.startswith("hookedattn"):
            continue
        for name in module._parameters:
            if name.isidentifier() and not any(name in vars(base) for base in cls.__mro__):
                setattr(cls, name, ParameterRead(name))
