"""A collection killed with SIGKILL mid-run, then rerun, ends byte-identical to an unbroken one."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from hookedattn.store import ActivationStore, collect_activations

# End to end (subprocesses, torchrun, real TransformerLens): run in CI with `-m slow`.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RESID = "blocks.1.hook_resid_pre"
ARGS = dict(n_tokens=16 * 4 * 100, batch_size=2, shard_contexts=4)  # 100 shards


def shard_count(folder: Path) -> int:
    try:
        return sum(n.startswith("shard-") for n in os.listdir(folder))
    except FileNotFoundError:
        return 0


def test_kill_9_then_rerun_gives_the_bytes_of_an_uninterrupted_run(tmp_path, saved_byte_model):
    model = saved_byte_model(tmp_path / "model", seed=3)
    reference = tmp_path / "reference"
    collect_activations(model, None, names=[RESID], out=reference, progress=False, **ARGS)
    out = tmp_path / "killed"
    command = [sys.executable, str(ROOT / "scripts" / "collect.py"), "--model",
               str(tmp_path / "model"), "--names", RESID, "--out", str(out), "--tokens",
               str(ARGS["n_tokens"]), "--batch-size", "2", "--shard-contexts", "4",
               "--threads", "1", "--no-progress"]  # fmt: skip
    child = subprocess.Popen(command, cwd=ROOT, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while shard_count(out) < 3 and child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.001)
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL, child.stderr.read().decode()
    n_killed = shard_count(out)
    assert 3 <= n_killed < 100, f"the kill landed with {n_killed} of 100 shards written"

    # Killed mid-run: the manifest still says "writing"; only whole shards are visible.
    partial = ActivationStore(out)
    assert not partial.complete and len(partial) == len(partial._shards) * 4 * 16
    whole = ActivationStore(reference)
    rows = torch.cat([torch.arange(*whole._shards[s.index].rows) for s in partial._shards])
    assert torch.equal(partial.rows(RESID, slice(None)), whole.rows(RESID, rows))

    again = collect_activations(model, None, names=[RESID], out=out, progress=False, **ARGS)
    assert len(again.resumed) >= 3 and len(again.resumed) + len(again.written) == 100
    files = sorted(p.name for p in reference.iterdir())
    assert sorted(p.name for p in out.iterdir()) == files  # no temporary file left behind
    for name in files:
        assert (out / name).read_bytes() == (reference / name).read_bytes(), name
