"""pytest fixtures for suites that test hookedattn models (`make_tiny_model`,
`no_leaked_hooks`, `pretrained`, `pretrained_<name>`).

They are defined in the top-level module `pytest_hookedattn`, which pytest loads by itself
once hookedattn is installed: that module imports neither torch nor hookedattn until a
fixture is used, so that installing hookedattn costs unrelated pytest sessions nothing
(see its docstring). This module is the same plugin under the package's name, for a suite
that turns the entry point off and loads it by name (`pytest -p no:hookedattn -p
hookedattn.testing.pytest_plugin`); loading both does no harm.
"""

from pytest_hookedattn import (
    fixture_name,
    hookedattn_shared_models,
    make_tiny_model,
    no_leaked_hooks,
    pretrained,
    pytest_configure,
    shipped_model_names,
)

__all__ = [
    "fixture_name",
    "hookedattn_shared_models",
    "make_tiny_model",
    "no_leaked_hooks",
    "pretrained",
    "pytest_configure",
    "shipped_model_names",
]
