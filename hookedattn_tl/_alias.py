"""The alias line: `transformer_lens` and every submodule path under it, resolved to this package.

`install()` puts a finder first on `sys.meta_path` that answers `import transformer_lens.X.Y`
with the module `hookedattn_tl.X.Y` itself (the same object under both names, so
`mock.patch("transformer_lens.X.f")` patches what the facade calls). A TL path this package
does not provide is a `ModuleNotFoundError` that names both spellings.
"""

import importlib
import importlib.abc
import importlib.machinery
import sys
import types

ALIAS = "transformer_lens"
TARGET = "hookedattn_tl"


class _AliasLoader(importlib.abc.Loader):
    """Loads `transformer_lens.X` as the already built module `hookedattn_tl.X`."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        try:
            return importlib.import_module(self.target)
        except ModuleNotFoundError as error:
            if error.name != self.target:
                raise  # the facade module exists; something it imports does not
            raise ModuleNotFoundError(
                f"No module named {spec.name!r}: hookedattn_tl (aliased as transformer_lens "
                f"by hookedattn_tl.install()) has no {self.target!r}; the porting guide "
                f"(docs/guide/porting.md) lists the TransformerLens modules it provides",
                name=spec.name,
            ) from None

    def exec_module(self, module: types.ModuleType) -> None:
        """Nothing to run: `create_module` returned the facade's module, already executed."""


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Finds `transformer_lens` and `transformer_lens.*` as the facade's modules."""

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        """A spec loading `hookedattn_tl...` for `transformer_lens...`; None for other names."""
        if fullname != ALIAS and not fullname.startswith(ALIAS + "."):
            return None
        facade = TARGET + fullname[len(ALIAS) :]
        spec = importlib.machinery.ModuleSpec(fullname, _AliasLoader(facade))
        return spec


def install() -> None:
    """Make `import transformer_lens...` import this package, for code that ports unchanged.

    After `hookedattn_tl.install()` (or `import hookedattn_tl.as_transformer_lens`), every
    `import transformer_lens`, `from transformer_lens.utilities.cache import ...` and
    `mock.patch("transformer_lens....")` reaches the facade's module of the same path.
    Calling it twice does nothing more. It refuses (`ImportError`, naming the module's
    file) when a real TransformerLens is already imported: the two would be mixed.
    """
    present = sys.modules.get(ALIAS)
    if present is not None and getattr(present, "__name__", None) != TARGET:
        where = getattr(present, "__file__", None) or repr(present)
        raise ImportError(
            f"hookedattn_tl.install(): a real transformer_lens is already imported "
            f"(from {where}); aliasing it now would mix the two. Install the alias before "
            f"anything imports transformer_lens, or run without the real package"
        )
    if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
    # Modules of the facade imported before the alias are registered under both names now,
    # so that `transformer_lens.utils is hookedattn_tl.utils` whichever came first.
    for name, module in list(sys.modules.items()):
        if name == TARGET or name.startswith(TARGET + "."):
            sys.modules.setdefault(ALIAS + name[len(TARGET) :], module)


def uninstall() -> None:
    """Undo `install()`: remove the finder and every `transformer_lens...` alias it made."""
    sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _AliasFinder)]
    for name, module in list(sys.modules.items()):
        aliased = name == ALIAS or name.startswith(ALIAS + ".")
        if aliased and getattr(module, "__name__", "").startswith(TARGET):
            del sys.modules[name]
