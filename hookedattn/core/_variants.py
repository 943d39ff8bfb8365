"""A module's chosen steps kept on a class of its own, so that a model is freed as soon as
its last reference goes.

A component composes its variants at construction by binding one of its methods to a plain
name (`self.write = self._write_summed`, `self.apply_positions = self._rotate`). A bound
method kept in the module's own dict refers back to the module, so every such module is a
reference cycle: `del model` would free the weights only at Python's next full collection
of cyclic garbage (a `transformers` model is freed at once), and on a GPU the next model
loaded could run out of memory first.

`keep_on_classes(modules)` (run by `setup()`) moves them: a module whose dict binds names to
its own methods gets the class `base + {name: function}` (one class per base and choice,
made once: `variant_class`), and the names leave its dict. A call is as fast (the name is
found on the class as any method is), and nothing in the module refers back to it. A name
bound later on the instance (a forward installed by nnsight, a step changed by the
TransformerLens facade) is read first, as any instance attribute is.

A chosen class is a subclass named as its base (`isinstance` holds; `type(module) is Block`
does not: compare `variant_base(type(module))`, which gives the base); `reclass` gives a
module another base with the same choice; called to build a module, it builds one of its
base, which chooses afresh; and it pickles as its base and the choice (`__reduce_ex__`),
so a model saved whole loads in a process that never built one.
"""

import types
from collections.abc import Iterable
from typing import Any

from torch import nn

# (base, choice) -> the class; a choice is a frozenset of (name, function) pairs.
_CLASSES: dict[tuple[type, frozenset], type] = {}


def keep_on_classes(modules: Iterable[Any]) -> None:
    """Move each module's own bound steps from its dict to a class of its own (module
    docstring; a plain object of the model's, `AttnInputs`, the same way)."""
    for module in modules:
        own = vars(module)
        chosen = {name: value.__func__ for name, value in own.items() if _is_chosen(module, name)}
        if not chosen:
            continue
        cls = type(module)
        module.__class__ = variant_class(variant_base(cls), {**choice_of(cls), **chosen})
        for name in chosen:
            del own[name]


def _is_chosen(module: Any, name: str) -> bool:
    """Whether `module.name` is one of its own methods under another name (a variant)."""
    value = vars(module)[name]
    return (
        isinstance(value, types.MethodType)
        and value.__self__ is module
        and name != value.__func__.__name__
        and not name.startswith("__")
    )


def variant_class(base: type, choice: dict[str, Any]) -> type:
    """The class `base` with the methods `choice` under their chosen names (made once)."""
    key = (base, frozenset(choice.items()))
    cls = _CLASSES.get(key)
    if cls is None:
        attributes = {
            **choice,
            "__module__": base.__module__,
            "__qualname__": base.__qualname__,
            "_variant_base": base,
            "_variant_choice": dict(choice),
            "__init__": _built_as_base,
            "__reduce_ex__": _reduce_ex,
        }
        cls = _CLASSES[key] = type(base)(base.__name__, (base,), attributes)
    return cls


def variant_base(cls: type) -> type:
    """The class a chosen class was made from (`cls` itself otherwise)."""
    return cls.__dict__.get("_variant_base", cls)


def choice_of(cls: type) -> dict[str, Any]:
    """The methods a chosen class keeps under their chosen names (none otherwise)."""
    return dict(cls.__dict__.get("_variant_choice", {}))


def reclass(module: nn.Module, base: type) -> None:
    """Give `module` the class `base`, keeping the steps it has chosen."""
    choice = choice_of(type(module))
    module.__class__ = variant_class(base, choice) if choice else base


def _built_as_base(self: Any, *args: Any, **kwargs: Any) -> None:
    """A chosen class called to build a module (`type(model)(cfg)`) builds one of its base,
    which makes its own choice: none is carried over from the module the class came from."""
    base = variant_base(type(self))
    self.__class__ = base
    base.__init__(self, *args, **kwargs)


def _reduce_ex(self: Any, protocol: int) -> tuple:
    """Pickle as the base class and the choice (a chosen class has no name of its own)."""
    cls = type(self)
    reduced = object.__reduce_ex__(self, protocol)
    return (_new, (variant_base(cls), tuple(choice_of(cls).items())), *reduced[2:])


def _new(base: type, choice: tuple[tuple[str, Any], ...]) -> Any:
    """An empty instance of `base`'s chosen class (`_reduce_ex`); its state comes after."""
    cls = variant_class(base, dict(choice))
    return cls.__new__(cls)
