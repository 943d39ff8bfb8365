"""What the tests that hold hookedattn_tl.HookedSAETransformer against real SAELens share.

SAELens 6.54.12 runs in an environment of its own (`.ci/saelens.sh` builds it and links it
at `~/.cache/hookedattn/sae_lens-6.54.12/`; `HOOKEDATTN_SAELENS_PYTHON` names another
interpreter), as a subprocess. Without it the tests skip, saying how to build it; under CI
(`CI` set) they fail instead, so CI always runs them. Not a test module.
"""

import os
from pathlib import Path
from typing import Any

import pytest

from helpers.tl_reference import run_script

VERSION = "6.54.12"
DEFAULT_PYTHON = Path.home() / ".cache" / "hookedattn" / f"sae_lens-{VERSION}" / "bin" / "python"


def require_saelens_python() -> Path:
    """SAELens's interpreter; skips the test without one (fails it under CI)."""
    given = os.environ.get("HOOKEDATTN_SAELENS_PYTHON")
    python = Path(given) if given else DEFAULT_PYTHON
    if not python.exists():
        message = (
            f"SAELens {VERSION}'s environment is missing: run `bash .ci/saelens.sh` (or set "
            f"HOOKEDATTN_SAELENS_PYTHON)"
        )
        if os.environ.get("CI"):
            pytest.fail(message + "; CI must run the comparison")
        pytest.skip(message)
    return python


def run_in_saelens(script: str, given: dict[str, Any], folder: Path) -> Any:
    """`python scripts/<script> IN.pt OUT.pt` in SAELens's environment, offline: its answer."""
    return run_script(require_saelens_python(), script, given, folder, None)
