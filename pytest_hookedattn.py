"""hookedattn's pytest plugin: fixtures for suites that test hookedattn models.

pytest loads this module in every session of an environment where hookedattn is
installed (it is the `pytest11` entry point; `pytest -p no:hookedattn` turns it off), most
of them suites that have nothing to do with hookedattn. So it is a guest: it imports only
pytest and the standard library, never torch or hookedattn, until a test asks for one of
its fixtures. A suite that uses none of them starts as fast as without the plugin, and a
broken hookedattn installation fails only the tests that use its fixtures (with the import
error), never the whole session.

Importing hookedattn late matters for a second reason: jaxtyping's shape checks
(`--jaxtyping-packages=hookedattn,...`) instrument only modules imported after pytest has
read its options, and refuse to start when the package is already imported.

Fixtures:

    make_tiny_model   build a tiny random float64 model, seeded by the test's id:
                      `model = make_tiny_model(attn_only=True)` (any config field)
    no_leaked_hooks   fail the test if it leaves a hook attached to any model
    pretrained        `pretrained("name")`: a shipped model, loaded once per session;
                      the test fails if it changes the model (hooks, weights, dtype,
                      training mode, requires_grad, cfg, tokenizer, hook.ctx, .grad),
                      and the change is undone so that later tests see it as shipped
    pretrained_<name> each shipped model as its own fixture (`-` in names becomes `_`),
                      with the same checks

No fixture here is a generator (teardown goes through `request.addfinalizer`): a suite
whose jaxtyping checks cover this module would wrap each function, and the wrapper is not
a generator function, so pytest would hand the test an unstarted generator.
"""

import importlib.util
import json
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def make_tiny_model(request: pytest.FixtureRequest) -> Callable[..., Any]:
    """`make_tiny_model(**config_fields)`: a tiny random model seeded by this test's id.

    The same test gets the same weights on every run, different tests get different ones;
    pass `seed=` to choose. The default shape is `hookedattn.testing.TINY_CONFIG`.
    """
    from hookedattn.testing._guards import seed_for, tiny_model

    seed = seed_for(request.node.nodeid)
    return lambda **overrides: tiny_model(seed, **overrides)


@pytest.fixture
def no_leaked_hooks(request: pytest.FixtureRequest) -> None:
    """Fail the test if it leaves any hook attached, on any model; the hooks are detached.

    Use it per test, or for a whole suite from a conftest:
    `pytestmark = pytest.mark.usefixtures("no_leaked_hooks")`.
    """
    from hookedattn.testing._guards import HookRecorder

    recorder = HookRecorder().start()

    def check() -> None:
        recorder.stop()
        leaked = recorder.detach_leaked()
        if leaked:
            pytest.fail(f"the test left hooks attached (now detached):\n{leaked}", pytrace=False)

    request.addfinalizer(check)


@pytest.fixture(scope="session")
def hookedattn_shared_models() -> Any:
    """The session's `SharedModels`: each shipped model loaded on first use, then kept."""
    from hookedattn.core.model import HookedTransformer
    from hookedattn.testing._guards import SharedModels

    return SharedModels(HookedTransformer.from_pretrained)


@pytest.fixture
def pretrained(request: pytest.FixtureRequest, hookedattn_shared_models: Any) -> Callable[..., Any]:
    """`pretrained(name, **kwargs)`: `HookedTransformer.from_pretrained(name, **kwargs)`,
    loaded once per session and shared (`hookedattn.list_pretrained()` lists the names).

    Because the model is shared, a test must not change it: what it leaves changed fails
    the test at teardown, and is undone for the tests after it.
    """
    used: list[tuple] = []

    def load(name: str, **kwargs: Any) -> Any:
        key, model = hookedattn_shared_models.get(name, **kwargs)
        used.append(key)
        return model

    request.addfinalizer(lambda: _check_shared(hookedattn_shared_models, used))
    return load


def _check_shared(shared: Any, keys: list[tuple]) -> None:
    problems = [p for key in dict.fromkeys(keys) for p in shared.check_and_restore(key)]
    if problems:
        lines = ["the test changed a session-shared model (now undone):", *problems]
        pytest.fail("\n".join(lines), pytrace=False)


def fixture_name(model_name: str) -> str:
    """The fixture of a shipped model: `bytes-attn-only-2l` -> `pretrained_bytes_attn_only_2l`."""
    return "pretrained_" + "".join(c if c.isalnum() else "_" for c in model_name)


def _per_model_fixture(model_name: str) -> Any:
    def fixture(request: pytest.FixtureRequest, hookedattn_shared_models: Any) -> Any:
        key, model = hookedattn_shared_models.get(model_name)
        request.addfinalizer(lambda: _check_shared(hookedattn_shared_models, [key]))
        return model

    fixture.__doc__ = f"The shipped model {model_name!r}, loaded once per session and shared."
    return pytest.fixture(name=fixture_name(model_name))(fixture)


def shipped_model_names() -> list[str]:
    """The shipped models' names, read from the package's `pretrained/index.json` without
    importing hookedattn (what `hookedattn.list_pretrained()` lists)."""
    spec = importlib.util.find_spec("hookedattn")  # a top-level name: found, not imported
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("hookedattn is not installed in this environment")
    index = Path(next(iter(spec.submodule_search_locations))) / "pretrained" / "index.json"
    names = json.loads(index.read_text())
    if not isinstance(names, dict):
        raise ValueError(f"{index} is not an index of shipped models")
    return sorted(names)


_FIXTURES_PLUGIN = "hookedattn-pretrained-fixtures"


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    """Register one fixture per shipped model (names only: nothing is loaded or imported).

    When the shipped models cannot be listed, the suite still runs, with a warning saying
    why: the `pretrained` fixture then raises the error in the tests that use it.
    """
    if config.pluginmanager.has_plugin(_FIXTURES_PLUGIN):
        return  # registered already, under the module's other name
    try:
        names = shipped_model_names()
    except (OSError, ValueError) as error:
        warning = pytest.PytestConfigWarning(f"hookedattn: no pretrained_<name> fixtures: {error}")
        config.issue_config_time_warning(warning, stacklevel=2)
        return
    holder = types.ModuleType("hookedattn_pretrained_fixtures")
    for name in names:
        setattr(holder, fixture_name(name), _per_model_fixture(name))
    config.pluginmanager.register(holder, _FIXTURES_PLUGIN)
