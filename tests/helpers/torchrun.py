"""Launching a test worker on two ranks with a real `torchrun` (gloo on the CPU)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def torchrun(script: Path, *args: str, timeout: int = 400) -> None:
    """Run `script` on two ranks (gloo); this checkout's packages first on the path."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone",
              "--nproc_per_node=2", str(script), *args]  # fmt: skip
    done = subprocess.run(launch, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
