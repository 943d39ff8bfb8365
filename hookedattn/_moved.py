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


def new_path(name: str) -> str | None:
    """Where the module `name` (a former path, or a submodule of one) lives now."""
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves a former path to the module at its new one (the same module object)."""

    def find_spec(self, fullname: str, path: object, target: object = None):
        if new_path(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = new_path(spec.name)
        warnings.warn(
            f"{spec.name} has moved to {new}: import it from there (or the name itself from "
            f"hookedattn)",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(new)

    def exec_module(self, module: ModuleType) -> None:
        pass


def install() -> None:
    """Register the namespaces' second names and the finder of former paths (once)."""
    for old, new in ALIASES.items():
        sys.modules.setdefault(old, importlib.import_module(new))
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
