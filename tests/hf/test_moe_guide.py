"""docs/guide/moe.md: its hook-name list is what `scripts/hook_names.py --moe` generates from
the code (its examples run in tests/project/test_docs.py)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "guide" / "moe.md"
# The examples import this checkout's packages, not another installed copy.
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def test_the_guides_hook_names_are_generated_from_the_code():
    generated = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "hook_names.py"), "--moe"],
        capture_output=True, text=True, check=True, env=ENV,
    ).stdout.strip()  # fmt: skip
    section = GUIDE.read_text().split("<!-- moe-hook-names:start -->")[1]
    section = section.split("<!-- moe-hook-names:end -->")[0]
    assert section.strip() == generated, "run: python scripts/hook_names.py --moe --write"
