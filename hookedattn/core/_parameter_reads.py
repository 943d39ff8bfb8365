"""A parameter read as cheaply as a plain attribute.

nn.Module keeps its parameters in `_parameters`, where `module.W_Q` reaches them only
through nn.Module.__getattr__ (Python), called after the ordinary lookup has failed: about
six times the cost of a property. A forward reads a few parameters per sublayer, and a
generated token on a small model is mostly such fixed costs.

`install(root)` gives each of hookedattn's module classes under `root`, for each parameter
name its instances hold, a property (`parameter_read`) that reads `_parameters` directly. It
keeps nothing itself: the parameter stays where torch keeps it, so assigning or deleting
one, `load_state_dict(assign=True)`, and `torch.func.functional_call` (which swaps the
entries of `_parameters`) are all read through it. A plain attribute of the same name set
on an instance (not a parameter, buffer or module) is kept in the instance's dict and read
from there, as before; a name a module holds neither way falls through to
nn.Module.__getattr__ (a buffer, a submodule, or its error). A property, not a descriptor
class of its own: `torch.compile` traces a property's getter as it traces any module's.
Classes that define the name already (a property such as grouped attention's `W_K`) and
classes outside hookedattn are left alone.
"""

from typing import Any

from torch import nn


def parameter_read(name: str) -> property:
    """The parameter `name` of a module, read from its `_parameters` (module docstring); an
    attribute of that name set outside them is kept in the instance's dict and read there."""

    def read(module: Any) -> Any:
        parameters = module.__dict__.get("_parameters")
        if parameters is not None and name in parameters:
            return parameters[name]
        if name in module.__dict__:
            return module.__dict__[name]
        raise AttributeError(name)  # nn.Module.__getattr__ takes over: buffers, submodules

    def write(module: Any, value: Any) -> None:
        module.__dict__[name] = value

    def delete(module: Any) -> None:
        try:
            del module.__dict__[name]
        except KeyError:
            raise AttributeError(name) from None

    return property(read, write, delete, doc=f"The parameter {name!r} (`_parameter_reads`).")


def install(root: nn.Module) -> None:
    """A `parameter_read` property on each hookedattn module class under `root` for each parameter
    name its instances there hold, where the class does not define the name already."""
    for module in root.modules():
        cls = type(module)
        if not cls.__module__.startswith("hookedattn"):
            continue
        for name in module._parameters:
            if name.isidentifier() and not any(name in vars(base) for base in cls.__mro__):
                setattr(cls, name, parameter_read(name))
