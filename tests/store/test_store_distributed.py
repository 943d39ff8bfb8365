"""Two ranks under a real `torchrun` (gloo, CPU) write exactly the files one process writes,
and a sweep shared between them gathers to what one process computes."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hookedattn.store import collect_activations, load_sweep, sweep

# End to end (subprocesses, torchrun, real TransformerLens): run in CI with `-m slow`.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
NAMES = ["blocks.0.hook_resid_pre", "blocks.1.attn.hook_pattern"]
N_TOKENS, BATCH, SHARD = 16 * 4 * 7, 2, 4  # 7 shards: rank 0 takes 4, rank 1 takes 3

WORKER = """
import runpy, sys
import torch
from analysis import activation_patch
from hookedattn import HookedTransformer
from hookedattn.store import init_from_env, sweep

model_dir, collect_out, sweep_out = sys.argv[1:4]
ranks = init_from_env()
model = HookedTransformer.load(model_dir)
clean, corrupted = torch.load(model_dir + "/pairs.pt")
metric = lambda logits: logits[:, -1, 0]


def patch(m, b):
    kwargs = dict(clean_tokens=b[0], corrupted_tokens=b[1], metric=metric)
    return activation_patch(m, kind="resid_pre", **kwargs).per_prompt.movedim(-1, 0)


result = sweep(model, patch, list(zip(clean, corrupted)), batch_size=2, out=sweep_out)
assert result.items.numel() == (7 if ranks.is_main else 3), result.items
sys.argv = ["collect.py", "--model", model_dir, "--names", *{names!r}, "--out", collect_out,
            "--tokens", "{n_tokens}", "--batch-size", "{batch}", "--shard-contexts", "{shard}",
            "--no-progress"]
runpy.run_path({collect!r}, run_name="__main__")
"""


def test_two_ranks_under_torchrun_write_the_one_process_files_and_gather_the_sweep(
    tmp_path, saved_byte_model
):
    model = saved_byte_model(tmp_path / "model", seed=5)
    generator = torch.Generator().manual_seed(0)
    clean = torch.randint(0, 256, (7, 6), generator=generator)
    corrupted = clean.clone()
    corrupted[:, 3] = (clean[:, 3] + 7) % 256
    torch.save((clean, corrupted), tmp_path / "model" / "pairs.pt")
    worker = tmp_path / "worker.py"
    collect = str(ROOT / "scripts" / "collect.py")
    worker.write_text(WORKER.format(names=NAMES, n_tokens=N_TOKENS, batch=BATCH, shard=SHARD,
                                    collect=collect))  # fmt: skip
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
              str(worker), str(tmp_path / "model"), str(tmp_path / "two"),
              str(tmp_path / "sweep.safetensors")]  # fmt: skip
    done = subprocess.run(launch, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]

    one = tmp_path / "one"
    collect_activations(model, None, names=NAMES, out=one, n_tokens=N_TOKENS, batch_size=BATCH,
                        shard_contexts=SHARD, progress=False)  # fmt: skip
    files = sorted(p.name for p in one.iterdir())
    assert len([f for f in files if f.startswith("shard-")]) == 7
    assert sorted(p.name for p in (tmp_path / "two").iterdir()) == files
    for name in files:  # manifest, stats and every shard, byte for byte
        assert (tmp_path / "two" / name).read_bytes() == (one / name).read_bytes(), name

    from analysis import activation_patch

    metric = lambda logits: logits[:, -1, 0]

    def patch(m, b):
        return activation_patch(
            m, kind="resid_pre", clean_tokens=b[0], corrupted_tokens=b[1], metric=metric
        ).per_prompt.movedim(-1, 0)

    pairs = list(zip(clean, corrupted, strict=True))
    alone = sweep(model, patch, pairs, batch_size=2)
    gathered = load_sweep(tmp_path / "sweep.safetensors")
    assert torch.equal(gathered.values["values"], alone.values["values"])
    assert gathered.labels == tuple(map(str, range(7))) and gathered.items.tolist() == [*range(7)]
    loop = torch.cat([patch(model, (c[None], x[None])) for c, x in pairs])
    torch.testing.assert_close(gathered.values["values"], loop)
