"""The pytest plugin, loaded as a user's suite loads it: by its entry point, in a fresh pytest.

A small user suite (below) runs once in a subprocess, with jaxtyping's shape checks on as in
our own configuration; each test here reads one outcome from its JUnit report. A shared
model left changed is reported and restored; a suite that does not use the plugin's
fixtures imports neither torch nor hookedattn, and a broken installation fails only the
tests that use them.
"""

import os
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from jaxtyping import TypeCheckError

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core.tokenizers import ByteTokenizer
from hookedattn.testing import tiny_model
from hookedattn.testing._guards import HookRecorder, SharedModels

PLUGIN = "hookedattn"  # the entry point: pytest registers the plugin under its name

# As in our own configuration: shape checks on hookedattn.
INI = """
[pytest]
addopts = -p no:cacheprovider --jaxtyping-packages=hookedattn,beartype.beartype
"""

CONFTEST = """
import pytest

LOADS = []


@pytest.fixture(scope="session")
def hookedattn_shared_models():
    # The plugin's session store, with tiny models in place of the shipped ones.
    from hookedattn.testing._guards import SharedModels, tiny_model

    def load(name):
        LOADS.append(name)
        return tiny_model(seed=len(name))

    return SharedModels(load)
"""

USER_SUITE = """
import pytest
import torch
from jaxtyping import TypeCheckError

from conftest import LOADS

SEEN = {}


def test_factory_gives_one_model_per_test(make_tiny_model):
    a, b = make_tiny_model(), make_tiny_model()
    assert torch.equal(a.W_E, b.W_E)
    SEEN["weights"] = a.W_E.clone()


def test_factory_gives_another_model_to_another_test(make_tiny_model):
    assert not torch.equal(make_tiny_model().W_E, SEEN["weights"])


def test_factory_takes_config_fields(make_tiny_model):
    model = make_tiny_model(attn_only=True, n_layers=1, dtype=torch.float32)
    assert model.cfg.attn_only and model.cfg.n_layers == 1
    assert model.W_E.dtype == torch.float32


def test_scoped_hooks_pass(no_leaked_hooks, make_tiny_model):
    model = make_tiny_model()
    hook = ("blocks.0.hook_resid_pre", lambda x, hook: None)
    model.run_with_hooks(torch.tensor([[1, 2, 3]]), fwd_hooks=[hook])


def test_leaks_a_hook(no_leaked_hooks, make_tiny_model):
    model = make_tiny_model()

    def leaky_ablation(z, hook):
        return torch.zeros_like(z)

    model.add_hook("blocks.0.attn.hook_z", leaky_ablation)
    SEEN["leaky"] = model


def test_the_leaked_hook_was_detached():
    assert SEEN["leaky"].attached_hooks() == []


def test_pretrained_first_use(pretrained):
    SEEN["shared"] = pretrained("tiny-a")


def test_pretrained_is_loaded_once(pretrained):
    assert pretrained("tiny-a") is SEEN["shared"]
    assert LOADS == ["tiny-a"]


def test_edits_shared_weights(pretrained):
    pretrained("tiny-a").blocks[1].attn.W_Q.data.zero_()


def test_shared_weights_were_restored(pretrained):
    assert pretrained("tiny-a").blocks[1].attn.W_Q.abs().sum() > 0


def test_leaves_a_hook_on_the_shared_model(pretrained):
    pretrained("tiny-a").add_hook("hook_embed", lambda x, hook: None)


def test_shared_model_has_no_hooks_left(pretrained):
    assert pretrained("tiny-a").attached_hooks() == []


def test_shape_checks_are_on(make_tiny_model):
    with pytest.raises(TypeCheckError):
        make_tiny_model().unembed(torch.zeros(3, 16, dtype=torch.float64))
"""


SHIPPED_SUITE = """
import pytest

from hookedattn.core._pretrained import list_pretrained
from hookedattn.testing import assert_residual_identities

NAMES = [info.name for info in list_pretrained()]
LOADED = {}


@pytest.mark.parametrize("name", NAMES)
def test_each_shipped_model_has_its_fixture(request, pretrained, name):
    model = request.getfixturevalue("pretrained_" + name.replace("-", "_"))
    assert model.cfg.model_name == name
    assert pretrained(name) is model
    LOADED[name] = model


@pytest.mark.parametrize("name", NAMES)
def test_shipped_model_is_loaded_once_and_its_identities_hold(pretrained, name):
    model = pretrained(name)
    assert model is LOADED[name]
    _, cache = model.run_with_cache(model.to_tokens("def f(x):\\n    return x + 1\\n"))
    assert_residual_identities(model, cache)
"""


@pytest.fixture(scope="module")
def user_run(tmp_path_factory) -> dict[str, str]:
    """Run the user suite in a fresh pytest; outcome (and message) per test name."""
    root = tmp_path_factory.mktemp("user_suite")
    (root / "pytest.ini").write_text(INI)
    (root / "stand_in").mkdir()  # shared models replaced by tiny ones
    (root / "stand_in" / "conftest.py").write_text(textwrap.dedent(CONFTEST))
    (root / "stand_in" / "test_user.py").write_text(textwrap.dedent(USER_SUITE))
    (root / "shipped").mkdir()  # the real shipped models
    (root / "shipped" / "test_shipped.py").write_text(textwrap.dedent(SHIPPED_SUITE))
    report = root / "report.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    completed = subprocess.run(
        [sys.executable, "-m", "pytest", f"--junitxml={report}", "stand_in", "shipped"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert report.exists(), completed.stdout + completed.stderr
    return _outcomes(report)


def _outcomes(report: Path) -> dict[str, str]:
    outcomes = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        problems = [c for c in case if c.tag in ("failure", "error", "skipped")]
        outcomes[case.get("name")] = (
            "passed"
            if not problems
            else "\n".join(f"{p.tag}: {p.get('message', '')}\n{p.text or ''}" for p in problems)
        )
    return outcomes


PASSING = [
    "test_factory_gives_one_model_per_test",
    "test_factory_gives_another_model_to_another_test",
    "test_factory_takes_config_fields",
    "test_scoped_hooks_pass",
    "test_the_leaked_hook_was_detached",
    "test_pretrained_first_use",
    "test_pretrained_is_loaded_once",
    "test_shared_weights_were_restored",
    "test_shared_model_has_no_hooks_left",
    "test_shape_checks_are_on",
]


@pytest.mark.parametrize("name", PASSING)
def test_user_suite_passes(user_run, name):
    assert user_run[name] == "passed"


def test_a_leaked_hook_fails_the_test_naming_it(user_run):
    outcome = user_run["test_leaks_a_hook"]
    assert outcome.startswith("error: failed on teardown")
    assert "the test left hooks attached (now detached)" in outcome
    assert "fwd hook test_leaks_a_hook.<locals>.leaky_ablation (stand_in/test_user.py:" in outcome
    assert "at blocks.0.attn.hook_z" in outcome


def test_editing_a_shared_model_fails_the_test(user_run):
    outcome = user_run["test_edits_shared_weights"]
    assert outcome.startswith("error: failed on teardown")
    assert "weights of 'tiny-a' changed: blocks.1.attn.W_Q" in outcome


def test_a_hook_left_on_a_shared_model_fails_the_test(user_run):
    outcome = user_run["test_leaves_a_hook_on_the_shared_model"]
    assert "hooks left attached to 'tiny-a'" in outcome
    assert "at hook_embed" in outcome


@pytest.mark.parametrize("test", ["has_its_fixture", "is_loaded_once_and_its_identities_hold"])
def test_every_shipped_model_works_through_the_fixtures(user_run, test):
    from hookedattn.core._pretrained import list_pretrained

    names = [info.name for info in list_pretrained()]
    assert names
    for name in names:
        outcome = next(o for n, o in user_run.items() if n.endswith(f"{test}[{name}]"))
        assert outcome == "passed", (name, outcome)


# ----------------------------------------------------------------- in this process
def test_shape_checks_stay_on_in_our_suite_with_the_plugin_loaded(request):
    if not request.config.getoption("jaxtyping_packages", None):
        pytest.skip("this run has no --jaxtyping-packages")
    assert request.config.pluginmanager.has_plugin(PLUGIN)
    model = HookedTransformer(
        HookedTransformerConfig(n_layers=1, d_model=8, n_heads=2, n_ctx=4, d_vocab=10, d_mlp=16)
    )
    with pytest.raises(TypeCheckError):
        model.unembed(torch.zeros(3, 8))  # [pos d_model], not [batch pos d_model]


def test_the_entry_point_imports_neither_hookedattn_nor_torch():
    code = (
        "import sys, pytest_hookedattn; sys.exit(bool({'hookedattn', 'torch'} & set(sys.modules)))"
    )
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0


def test_hook_recorder_sees_hooks_on_models_built_inside_it():
    with HookRecorder() as recorder:
        model = HookedTransformer(
            HookedTransformerConfig(n_layers=1, d_model=8, n_heads=2, n_ctx=4, d_vocab=10, d_mlp=16)
        )
        with model.hooks(fwd_hooks=[("hook_embed", lambda x, hook: None)]):
            pass
        kept = model.add_hook("blocks.0.hook_resid_pre", lambda x, hook: None)
    assert len(recorder.added) == 2
    assert recorder.leaked() == kept


def test_shared_models_restore_weights_and_report_nothing_when_untouched():
    shared = SharedModels(
        lambda name: HookedTransformer(
            HookedTransformerConfig(
                n_layers=1, d_model=8, n_heads=2, n_ctx=4, d_vocab=10, d_mlp=16, seed=0
            )
        )
    )
    key, model = shared.get("m")
    assert shared.check_and_restore(key) == []
    before = model.W_E.clone()
    model.W_E.data.add_(1.0)
    assert len(shared.check_and_restore(key)) == 1
    assert torch.equal(model.W_E, before)


def tiny(name: str) -> HookedTransformer:
    fields = dict(n_layers=1, d_model=8, n_heads=2, n_ctx=4, d_vocab=259, d_mlp=16)
    return tiny_model(tokenizer=ByteTokenizer(), dtype=torch.float32, **fields).eval()


def zero_hook(x, hook):
    return x * 0


CHANGES = {
    "permanent hook": (lambda m: m.add_perma_hook("hook_embed", zero_hook), "hooks left"),
    "dtype": (lambda m: m.to(torch.float64), "dtype or device of 'm' changed"),
    "training mode": (lambda m: m.train(), "left in training mode"),
    "requires_grad": (lambda m: m.W_E.requires_grad_(False), "requires_grad of 'm' changed"),
    "tokenizer": (lambda m: setattr(m, "tokenizer", None), "tokenizer of 'm' was replaced"),
    "cfg": (
        lambda m: setattr(m, "cfg", m.cfg.replace(model_name="other")),
        "config of 'm' was replaced",
    ),
    "hook ctx": (lambda m: m.hook_dict["hook_embed"].ctx.update(x=1), "hook.ctx left"),
    ".grad": (lambda m: m(torch.tensor([[1, 2]]), return_type="loss").backward(), ".grad left"),
}


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_to_a_shared_model_is_reported_and_undone(change):
    shared = SharedModels(tiny)
    key, model = shared.get("m")
    untouched = tiny("m")
    make_change, message = CHANGES[change]
    make_change(model)
    problems = shared.check_and_restore(key)
    assert any(message in p for p in problems), problems
    _, model = shared.get("m")  # what the next test gets
    assert shared.check_and_restore(key) == []
    assert model.attached_hooks() == [] and not model.training
    assert model.cfg == untouched.cfg and isinstance(model.tokenizer, ByteTokenizer)
    assert all(p.grad is None and p.requires_grad for p in model.parameters())
    assert all(not point.ctx for point in model.hook_dict.values())
    for name, t in untouched.state_dict().items():
        assert model.state_dict()[name].dtype == t.dtype and torch.equal(
            model.state_dict()[name], t
        )
    tokens = torch.tensor([[1, 2, 3]])
    torch.testing.assert_close(model(tokens), untouched(tokens))


# --------------------------------------------------------- the plugin as a guest
UNRELATED = """
import sys


def test_unrelated():
    assert "torch" not in sys.modules and "hookedattn" not in sys.modules
"""

USES_A_FIXTURE = """
def test_uses_a_fixture(make_tiny_model):
    make_tiny_model()
"""


def run_pytest(root: Path, extra_path: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    if extra_path:
        env["PYTHONPATH"] = extra_path
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:hypothesispytest",
            "-rA",
        ],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_an_unrelated_suite_imports_neither_torch_nor_hookedattn(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_unrelated.py").write_text(textwrap.dedent(UNRELATED))
    completed = run_pytest(tmp_path)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "1 passed" in completed.stdout


def test_a_broken_installation_fails_only_the_tests_using_its_fixtures(tmp_path):
    # A hookedattn whose import fails, found before the real one.
    broken = tmp_path / "broken" / "hookedattn"
    (broken / "pretrained").mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('hookedattn is broken here')\n")
    (broken / "pretrained" / "index.json").write_text('{"tiny-x": {}}\n')
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "pytest.ini").write_text("[pytest]\n")
    (suite / "test_unrelated.py").write_text(textwrap.dedent(UNRELATED))
    (suite / "test_fixture.py").write_text(textwrap.dedent(USES_A_FIXTURE))
    completed = run_pytest(suite, extra_path=str(tmp_path / "broken"))
    out = completed.stdout + completed.stderr
    assert "INTERNALERROR" not in out
    assert "PASSED test_unrelated.py::test_unrelated" in out
    assert "ERROR test_fixture.py::test_uses_a_fixture" in out
    assert "hookedattn is broken here" in out
