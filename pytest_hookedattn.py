"""The pytest entry point of hookedattn: registers `hookedattn.testing.pytest_plugin`.

Why a module of its own, outside the package: pytest imports entry-point plugins before
it reads its options, and importing any module inside `hookedattn` first runs
`hookedattn/__init__.py`, which imports the whole library. jaxtyping's shape checks
(`--jaxtyping-packages=hookedattn,...`) instrument only modules imported after pytest has
read its options, and refuse to start when the package is already imported. So this
module imports nothing from hookedattn, and hands over to the real plugin once the
options are read.
"""

import pytest


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Load the fixtures now that every import hook (jaxtyping's, typeguard's) is in place."""
    config.pluginmanager.import_plugin("hookedattn.testing.pytest_plugin")
