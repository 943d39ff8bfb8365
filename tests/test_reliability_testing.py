"""The testing helpers and fixtures never pass what they should fail: NaN in a comparison,
a shared model left changed, a broken installation taking down unrelated suites."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from hookedattn import ActivationCache, HookedTransformer
from hookedattn.core.tokenizers import ByteTokenizer
from hookedattn.testing import assert_close_cache, assert_decomposes, tiny_model
from hookedattn.testing._guards import SharedModels

NAN, INF = float("nan"), float("inf")
NAME = "blocks.0.hook_resid_pre"


def cache_of(*values: float) -> ActivationCache:
    return ActivationCache({NAME: torch.tensor([[values]], dtype=torch.float64)}, n_layers=1)


# ------------------------------------------------------------------------ NaN
@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((NAN, 1.0), (0.5, 1.0)),  # NaN in the cache under test
        ((0.5, 1.0), (NAN, 1.0)),  # NaN in the reference: the bound was NaN, so it passed
        ((NAN, 1.0), (NAN, 1.0)),  # both, but equal_nan was not asked for
        ((1.0, 1.0), (INF, 1.0)),  # a finite value against an infinity
    ],
)
def test_assert_close_cache_fails_on_nan_and_infinity(a, b):
    with pytest.raises(AssertionError, match=NAME):
        assert_close_cache(cache_of(*a), cache_of(*b))


def test_assert_close_cache_accepts_nan_on_both_sides_only_when_asked():
    assert_close_cache(cache_of(NAN, 1.0), cache_of(NAN, 1.0), equal_nan=True)
    assert_close_cache(cache_of(-INF, 1.0), cache_of(-INF, 1.0))
    with pytest.raises(AssertionError):
        assert_close_cache(cache_of(NAN, 1.0), cache_of(1.0, NAN), equal_nan=True)


@pytest.mark.parametrize(
    ("components", "target"),
    [
        ([[NAN, 1.0], [1.0, 1.0]], [2.0, 2.0]),  # a NaN component: the bound was NaN
        ([[1.0, 1.0], [1.0, 1.0]], [NAN, 2.0]),  # a NaN target
        ([[NAN, 1.0], [1.0, 1.0]], [NAN, 2.0]),  # both, not asked for
        ([[INF, 1.0], [-INF, 1.0]], [0.0, 2.0]),  # infinities that cancel to NaN
    ],
)
def test_assert_decomposes_fails_on_nan(components, target):
    parts = torch.tensor(components, dtype=torch.float64)
    with pytest.raises(AssertionError, match="do not sum to the target"):
        assert_decomposes(parts, torch.tensor(target, dtype=torch.float64))


def test_assert_decomposes_accepts_nan_on_both_sides_only_when_asked():
    parts = torch.tensor([[NAN, 1.0], [1.0, 1.0]], dtype=torch.float64)
    assert_decomposes(parts, torch.tensor([NAN, 2.0], dtype=torch.float64), equal_nan=True)


# ------------------------------------------------------------------ shared models
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
