"""The model core's former import paths (`hookedattn.config`, `hookedattn.model`, ...).

The core moved into `hookedattn.core`; a script that still imports `hookedattn.model`
gets the module at its new path, with a `DeprecationWarning` naming it. `hookedattn.names`
and `hookedattn.tolerances` are namespaces of the package itself and import silently.
"""

import importlib
import importlib.abc
import importlib.util
import sys
import warnings
from types import ModuleType

# Public modules before the move -> where they are now.
MOVED: dict[str, str] = {
    "hookedattn.cache": "hookedattn.core.cache",
    "hookedattn.components": "hookedattn.core.components",
    "hookedattn.config": "hookedattn.core.config",
    "hookedattn.factored_matrix": "hookedattn.core.factored_matrix",
    "hookedattn.hf": "hookedattn.core.hf",
    "hookedattn.hf_import": "hookedattn.core.hf",
    "hookedattn.hook_points": "hookedattn.core.hook_points",
    "hookedattn.kv_cache": "hookedattn.core.kv_cache",
    "hookedattn.loss": "hookedattn.core.loss",
    "hookedattn.model": "hookedattn.core.model",
    "hookedattn.processing": "hookedattn.core.processing",
    "hookedattn.tokenizers": "hookedattn.core.tokenizers",
}
# Namespaces `hookedattn` exports itself: the same modules under both names, no warning.
ALIASES: dict[str, str] = {
    "hookedattn.names": "hookedattn.core.names",
    "hookedattn.tolerances": "hookedattn.core.tolerances",
}


class MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves each former path in `moved` (former -> new, submodules included) to the
    module at its new one, the same module object, with a `DeprecationWarning` naming it
    (the name itself can also be imported from `package`).

    It goes first on `sys.meta_path`: a former package's submodules would otherwise be
    found a second time, as new module objects, through the new package's `__path__`.
    `analysis` uses it for its own former paths (`analysis/_moved.py`)."""

    def __init__(self, moved: dict[str, str], package: str) -> None:
        self.moved, self.package = moved, package
        self._specs: dict[str, importlib.machinery.ModuleSpec] = {}  # former path -> new spec

    def new_path(self, name: str) -> str | None:
        """Where the module `name` (a former path, or a submodule of one) lives now."""
        for old in sorted(self.moved, key=len, reverse=True):  # the most specific first
            if name == old or name.startswith(old + "."):
                return self.moved[old] + name[len(old) :]
        return None

    def find_spec(self, fullname: str, path: object, target: object = None):
        """A spec loading the module at the new path, for a former path; None otherwise."""
        if self.new_path(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        """The module at the new path, after the warning that names it."""
        new = self.new_path(spec.name)
        warnings.warn(
            f"{spec.name} has moved to {new}: import it from there (or the name itself from "
            f"{self.package})",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        """Give the module back its own spec (the import system set the former path's)."""
        module.__spec__ = self._specs.pop(module.__spec__.name)


def new_path(name: str) -> str | None:
    """Where the module `name` (a former path of the core, or a submodule of one) lives now."""
    return MovedFinder(MOVED, "hookedattn").new_path(name)


def install_finder(moved: dict[str, str], package: str) -> None:
    """Put a `MovedFinder` of `package`'s former paths first on `sys.meta_path` (once)."""
    if not any(isinstance(f, MovedFinder) and f.package == package for f in sys.meta_path):
        sys.meta_path.insert(0, MovedFinder(moved, package))


def install() -> None:
    """Register the namespaces' second names and the finder of former paths (once)."""
    for old, new in ALIASES.items():
        sys.modules.setdefault(old, importlib.import_module(new))
    install_finder(MOVED, "hookedattn")
