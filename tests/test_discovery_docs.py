"""Every Python example of docs/guide/discovery.md runs as written, in a fresh interpreter
(offline, on the shipped models), importing this checkout's packages."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "guide" / "discovery.md"
BLOCKS = re.findall(r"```python\n(.*?)```", GUIDE.read_text(), flags=re.S)


def test_the_guide_has_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_guide_example_runs(index, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(BLOCKS[index])
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"example {index} failed:\n{BLOCKS[index]}\n{proc.stderr}"
