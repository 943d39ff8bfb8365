"""The former import paths of analysis's modules (`analysis.attribution`, `analysis.graphs`, ...).

The rooms were renamed for what they hold (the four kinds of attribution told apart, the
two kinds of graph, the interventions gathered in `patching/`). A script that still
imports a former path gets the module at its new one, the same module object, with a
`DeprecationWarning` naming it; a submodule of a moved package resolves the same way
(`analysis.graphs.pruning` is `analysis.attribution_graphs.pruning`). This is the
counterpart of `hookedattn/_moved.py`; the design page (`docs/design.md`) lists the rooms.

The finder goes first on `sys.meta_path`: a former package's submodules would otherwise be
found a second time, as new module objects, through the new package's `__path__`.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from types import ModuleType

# Modules before the renaming -> where they are now (private ones too: scripts used them).
MOVED: dict[str, str] = {
    "analysis.attribution": "analysis.direct_logit_attribution",
    "analysis.graphs": "analysis.attribution_graphs",
    "analysis.graphs.graph": "analysis.attribution_graphs.attribution_graph",
    "analysis.discovery.attribution": "analysis.discovery.edge_attribution",
    "analysis.discovery.graph": "analysis.discovery.computational_graph",
    "analysis.feature_patching": "analysis.patching.feature_patching",
    "analysis._ablations": "analysis.patching._ablations",
    "analysis._pattern_ablation": "analysis.patching._pattern_ablation",
    "analysis.patching._attribution": "analysis.patching._attribution_patching",
    "analysis.patching._engine": "analysis.patching._sweep",
}


def new_path(name: str) -> str | None:
    """Where the module `name` (a former path, or a submodule of one) lives now."""
    for old in sorted(MOVED, key=len, reverse=True):  # the most specific former path first
        if name == old or name.startswith(old + "."):
            return MOVED[old] + name[len(old) :]
    return None


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Resolves a former path to the module at its new one (the same module object)."""

    def __init__(self) -> None:
        self._specs: dict[str, importlib.machinery.ModuleSpec] = {}  # former path -> new spec

    def find_spec(self, fullname: str, path: object, target: object = None):
        if new_path(fullname) is None:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        new = new_path(spec.name)
        warnings.warn(
            f"{spec.name} has moved to {new}: import it from there (or the name itself "
            f"from analysis)",
            DeprecationWarning,
            stacklevel=2,
        )
        module = importlib.import_module(new)
        self._specs[spec.name] = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system has set the former path's spec on the module: give it its own.
        module.__spec__ = self._specs.pop(module.__spec__.name)


def install() -> None:
    """Put the finder of former paths first on `sys.meta_path` (once)."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
