"""Every Python block of docs/guide/generation.md runs as written, in a fresh interpreter,
against this checkout; the output it prints is the `text` block that follows it."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "guide" / "generation.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```\n\n```text\n(.*?)```", PAGE, flags=re.S)


def test_the_page_has_its_examples():
    assert len(BLOCKS) == len(re.findall(r"```python\n", PAGE)) >= 3


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_each_example_prints_what_the_page_shows(index, tmp_path):
    code, shown = BLOCKS[index]
    script = tmp_path / "example.py"
    script.write_text("import torch\ntorch.set_num_threads(1)\n" + code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == shown
