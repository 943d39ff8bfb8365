"""What the tests that hold hookedattn_tl.HookedSAETransformer against real SAELens share.

SAELens 6.54.12 runs in an environment of its own (`.ci/saelens.sh` builds it and links it
at `~/.cache/hookedattn/sae_lens-6.54.12/`; `HOOKEDATTN_SAELENS_PYTHON` names another
interpreter), as a subprocess. Without it the tests skip, saying how to build it; under CI
(`CI` set) they fail instead, so CI always runs them. Not a test module.
"""

from pathlib import Path
from typing import Any

from helpers.tl_reference import require_peer_python, run_script

VERSION = "6.54.12"


def require_saelens_python() -> Path:
    """SAELens's interpreter; skips the test without one (fails it under CI)."""
    return require_peer_python(
        f"SAELens {VERSION}", f"sae_lens-{VERSION}", "saelens.sh", "HOOKEDATTN_SAELENS_PYTHON"
    )


def run_in_saelens(script: str, given: dict[str, Any], folder: Path) -> Any:
    """`python scripts/<script> IN.pt OUT.pt` in SAELens's environment, offline: its answer."""
    return run_script(require_saelens_python(), script, given, folder, None)
