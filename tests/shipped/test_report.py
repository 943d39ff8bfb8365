"""`python scripts/induction` end to end: the report folder, and a folder it cannot write."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

# End to end (subprocesses, torchrun, real TransformerLens): run in CI with `-m slow`.
pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "induction"  # a folder: python runs its __main__.py
FIGURES = (
    "attention_patterns.png",
    "head_scores.png",
    "composition.png",
    "logit_attribution.png",
    "icl_curve.png",
    "circuits.png",
    "training_dynamics.png",
)


def _run(out):
    command = [sys.executable, str(SCRIPT), "--out", str(out)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)


def test_the_report_folder_holds_the_markdown_and_every_figure(tmp_path):
    out = tmp_path / "report"
    done = _run(out)
    assert done.returncode == 0, done.stderr
    assert str(out / "report.md") in done.stdout
    text = (out / "report.md").read_text()
    for name in FIGURES:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"]({name})" in text, name
    assert (out / "attention.html").read_text().startswith("<!DOCTYPE html>")
    assert "](attention.html)" in text  # the report links its interactive page
    for section in ("## Findings", "QK circuit", "OV circuit", "## Thresholds"):
        assert section in text
    assert "[5/5]" in done.stderr  # the stages show progress
    held = re.search(r"(\d+)/(\d+) findings hold", done.stdout)
    guide = (REPO / "docs" / "guide" / "shipped-models.md").read_text()
    claim = re.search(
        r"On the\s+shipped\s+`bytes-attn-only-2l`[^,]*,\s+(\d+) of its (\d+) findings", guide
    )
    assert claim and claim.groups() == held.groups(), "the shipped-models guide's count of findings"


def test_a_folder_that_cannot_be_written_is_a_clear_error(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    done = _run(blocker / "report")
    assert done.returncode == 2
    assert "cannot write the report to" in done.stderr and "Traceback" not in done.stderr
