"""Every Python example in the README runs as written, in a fresh interpreter."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(), flags=re.S)
# A user's test file (it needs pytest's fixtures) is run by tests/test_pytest_plugin.py.
EXAMPLES = [block for block in BLOCKS if "def test_" not in block]


def test_the_readme_has_examples():
    assert len(EXAMPLES) >= 5


@pytest.mark.parametrize("index", range(len(EXAMPLES)))
def test_readme_example_runs(index, tmp_path):
    script = tmp_path / "example.py"
    script.write_text(EXAMPLES[index])
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, f"README example {index} failed:\n{EXAMPLES[index]}\n{proc.stderr}"


def test_the_training_table_gives_each_shipped_models_recorded_cpu_time():
    from hookedattn import list_pretrained

    text = (ROOT / "README.md").read_text()
    for info in list_pretrained():
        row = re.search(rf"\| `{info.name}` .*\| ([\d.]+) (s|min) \|", text)
        assert row, f"no row for {info.name} in the README's training table"
        seconds = float(row[1]) * (60 if row[2] == "min" else 1)
        recorded = info.training["cpu_seconds"]
        shown = round(recorded / 60, 1) * 60 if row[2] == "min" else round(recorded)
        assert seconds == pytest.approx(shown), (info.name, seconds, recorded)
