"""The fault-injection check (`scripts/faults.py`): its list still applies, and it reports
which test files catch a fault without touching the tree it copies.

The check itself (every fault against the suite) takes many minutes and is not run here;
see docs/guide/testing.md. These run the script in subprocesses (nothing imports scripts/):
on this tree with `--check`, and end to end on a tiny repository made in the test.
"""

import os
import subprocess
import sys
import textwrap
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "faults.py"
FAULTS = tomllib.loads((ROOT / "scripts" / "data" / "faults.toml").read_text())["fault"]


def faults_script(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [sys.executable, str(SCRIPT), *args]
    env = None if env is None else {**os.environ, **env}
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)


def test_every_fault_still_applies_to_the_tree():
    done = faults_script("--check")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(FAULTS)} faults, {len(FAULTS)} apply, 0 no longer apply" in done.stdout


def test_every_fault_names_at_least_two_existing_test_files_and_changes_its_line():
    assert len(FAULTS) >= 25
    for fault in FAULTS:
        tests = fault["tests"]
        assert len(set(tests)) == len(tests) >= 2, fault["id"]
        assert all((ROOT / t).is_file() and Path(t).match("tests/*/test_*") for t in tests), tests
        assert fault["original"] != fault["replacement"], fault["id"]


def test_the_faults_spread_over_core_kernels_analysis_and_applications():
    areas = {f["file"].split("/")[1] if f["file"].startswith("hookedattn/") else "analysis"
             for f in FAULTS}  # fmt: skip
    assert {"core", "sae", "store", "analysis"} <= areas
    assert sum("/kernels/" in f["file"] for f in FAULTS) >= 5


def test_a_fault_whose_original_text_is_gone_no_longer_applies(tmp_path):
    listed = tmp_path / "faults.toml"
    listed.write_text(
        textwrap.dedent("""
        [[fault]]
        id = "stale"
        what = "a line that was since rewritten"
        file = "hookedattn/core/config.py"
        original = "this text is not in the file"
        replacement = "nor is this"
        tests = ["tests/core/test_config.py", "tests/core/test_model.py"]
    """)
    )
    done = faults_script("--check", "--faults", str(listed))
    assert done.returncode == 1
    assert "NO LONGER APPLIES  stale: its original text is no longer in" in done.stdout


def tiny_repository(root: Path) -> None:
    """A repository with one function, two tests that pin it and one that cannot fail."""
    pin = "from lib import add\n\n\ndef test_add():\n    assert add({}, {}) == {}\n"
    files = {
        "lib.py": "def add(a, b):\n    return a + b\n",
        "tests/test_one.py": pin.format(2, 3, 5),
        "tests/test_two.py": pin.format(4, -1, 3),
        "tests/test_blind.py": "def test_nothing():\n    assert True\n",
        "faults.toml": textwrap.dedent("""
            [[fault]]
            id = "subtracts"
            what = "add subtracts"
            file = "lib.py"
            original = "return a + b"
            replacement = "return a - b"
            tests = ["tests/test_one.py", "tests/test_two.py", "tests/test_blind.py"]

            [[fault]]
            id = "commutes"
            what = "a change no test can see"
            file = "lib.py"
            original = "return a + b"
            replacement = "return b + a"
            tests = ["tests/test_one.py", "tests/test_blind.py"]
        """),
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    subprocess.run(["git", "init", "-q", str(root)], check=True)


@pytest.mark.slow
def test_the_check_names_the_files_that_catch_each_fault_and_leaves_the_tree_alone(tmp_path):
    tiny_repository(tmp_path)
    # The tiny repository's tests need none of the environment's pytest plugins.
    quick = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = faults_script(
        "--root", str(tmp_path), "--faults", str(tmp_path / "faults.toml"), env=quick
    )
    assert "ok   subtracts  [2/3" in done.stdout, done.stdout + done.stderr
    assert "caught by test_one, test_two\n" in done.stdout
    assert "MISS commutes  [0/2" in done.stdout and "caught by nothing" in done.stdout
    assert "2 faults: 1 caught by at least 2 test files, 1 not, 0 no longer apply" in done.stdout
    assert done.returncode == 1  # one fault is caught by fewer than two files
    assert (tmp_path / "lib.py").read_text() == "def add(a, b):\n    return a + b\n"
