"""docs/guide/moe.md: every Python example runs as written, in a fresh interpreter, and its
hook-name list is what `scripts/hook_names.py --moe` generates from the code."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide" / "moe.md"
EXAMPLES = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)
# The examples import this checkout's packages, not another installed copy.
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def test_the_guide_has_examples():
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_guide_example_runs(index, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(EXAMPLES[index])
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
        timeout=300, env=ENV,
    )  # fmt: skip
    assert proc.returncode == 0, f"guide example {index} failed:\n{EXAMPLES[index]}\n{proc.stderr}"


def test_the_guides_hook_names_are_generated_from_the_code():
    generated = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "hook_names.py"), "--moe"],
        capture_output=True, text=True, check=True, env=ENV,
    ).stdout.strip()  # fmt: skip
    section = GUIDE.read_text().split("<!-- moe-hook-names:start -->")[1]
    section = section.split("<!-- moe-hook-names:end -->")[0]
    assert section.strip() == generated, "run: python scripts/hook_names.py --moe --write"
