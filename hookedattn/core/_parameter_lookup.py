"""Reading a module's parameters without nn.Module.__getattr__.

A parameter lives in the module's `_parameters`, not its instance dict, so `self.W_in` first
fails the ordinary lookup: Python builds an AttributeError (its message formatted) and only
then calls nn.Module.__getattr__, which finds it. At the one-token decode step every
weight is read that way, some forty times per token at two layers: a sizeable share of the
step's cost on a small model.

`install` puts a data descriptor (`_ParameterLookup`) on a module's class for each name
that is one of its parameters; the ordinary lookup finds it first. It reads the module's
own dicts in the order the plain lookup would (the instance dict, then parameters, buffers
and submodules, as nn.Module.__getattr__), at the time of each read, so a parameter
replaced by any route (assignment, `register_parameter`, `_parameters[name] = ...`,
`torch.func.functional_call`) is seen at once. A class attribute of that name (a property)
is never shadowed: no descriptor is put there.
"""

from typing import Any

from torch import nn


class _ParameterLookup:
    """`module.<name>` for a name that is a parameter of some instance of the class."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __get__(self, module: Any, owner: type | None = None) -> Any:
        if module is None:
            return self
        name, own = self.name, module.__dict__
        if name in own:
            return own[name]
        for field in ("_parameters", "_buffers", "_modules"):
            values = own.get(field)
            if values is not None and name in values:
                return values[name]
        raise AttributeError(f"'{type(module).__name__}' object has no attribute '{name}'")

    def __set__(self, module: Any, value: Any) -> None:
        # Reached only through object.__setattr__: nn.Module.__setattr__ keeps parameters,
        # buffers and submodules in their dicts and hands every other value on to it.
        module.__dict__[self.name] = value

    def __delete__(self, module: Any) -> None:
        if self.name not in module.__dict__:
            raise AttributeError(self.name)
        del module.__dict__[self.name]


def install(modules: list[nn.Module]) -> None:
    """Put a `_ParameterLookup` on the class of each of `modules` that hookedattn defines,
    for each of its own parameters' names that the class does not define (idempotent).
    Classes of other libraries (torch's `nn.Linear`, a user's module) are left as they are:
    a descriptor there would reach every instance in the process."""
    for module in modules:
        cls = type(module)
        if not cls.__module__.startswith("hookedattn."):
            continue
        for name in module._parameters:
            if name.isidentifier() and not hasattr(cls, name):
                setattr(cls, name, _ParameterLookup(name))
