"""Bad input to the store: each a clear error, and nothing half-written read as data."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.store import RESID, byte_model

from hookedattn.store import ActivationStore, StoreError, collect_activations

TEXT = "import os\nprint(os.getcwd())\n" * 20
ROOT = Path(__file__).resolve().parents[2]


def make_store(out: Path, **kwargs) -> Path:
    options = dict(names=[RESID], out=out, batch_size=2, shard_contexts=4, progress=False)
    collect_activations(byte_model(), [TEXT], **{**options, **kwargs})
    return out


def test_a_folder_without_a_manifest_is_not_a_store(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(StoreError, match=r"is not an activation store: it has no manifest.json"):
        ActivationStore(tmp_path)
    with pytest.raises(StoreError, match=r"is not a folder"):
        ActivationStore(tmp_path / "notes.txt")


def test_a_json_file_of_another_kind_is_not_a_manifest(tmp_path):
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "something-else"}))
    with pytest.raises(StoreError, match=r"format 'something-else', expected"):
        ActivationStore(tmp_path)


def test_a_manifest_from_another_version_is_refused(tmp_path):
    out = make_store(tmp_path / "s")
    manifest = json.loads((out / "manifest.json").read_text())
    (out / "manifest.json").write_text(json.dumps({**manifest, "version": 99}))
    with pytest.raises(StoreError, match=r"format version 99; this hookedattn reads version 2"):
        ActivationStore(out)
    (out / "manifest.json").write_text(json.dumps({**manifest, "version": 1}))
    with pytest.raises(StoreError, match=r"version 1 \(no content hashes.*collect the store again"):
        ActivationStore(out)


def test_a_truncated_shard_is_refused_by_its_size(tmp_path):
    out = make_store(tmp_path / "s")
    shard = out / "shard-00001.safetensors"
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(StoreError, match=r"shard-00001.safetensors is truncated or damaged"):
        ActivationStore(out)


def test_a_missing_shard_is_named(tmp_path):
    out = make_store(tmp_path / "s")
    (out / "shard-00002.safetensors").unlink()
    with pytest.raises(StoreError, match=r"shard shard-00002.safetensors .* is missing .*8..12"):
        ActivationStore(out)


def test_unknown_hook_names_get_the_closest_ones(tmp_path):
    with pytest.raises(KeyError, match=r"did you mean 'blocks.1.hook_resid_pre'"):
        make_store(tmp_path / "s", names=["blocks.1.hook_resid_pr"])
    store = ActivationStore(make_store(tmp_path / "t"))
    with pytest.raises(KeyError, match=r"in this store; did you mean 'blocks.1.hook_resid_pre'"):
        store.rows("blocks.1.hook_resid_post", 0)


def test_a_folder_holding_another_collection_is_refused_unless_overwritten(tmp_path):
    out = make_store(tmp_path / "s")
    with pytest.raises(StoreError, match=r"holds another collection .* overwrite=True"):
        make_store(out, names=["blocks.0.hook_resid_pre"])
    make_store(out, names=["blocks.0.hook_resid_pre"], overwrite=True)
    assert ActivationStore(out).names == ["blocks.0.hook_resid_pre"]
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "data.csv").write_text("1,2")
    with pytest.raises(StoreError, match=r"not empty and not an activation store"):
        make_store(tmp_path / "other")


def test_float16_overflow_warns_with_the_count_of_infinities(tmp_path):
    model = byte_model(scale=3e4)  # embeddings beyond float16's 65504
    out = tmp_path / "s"
    with pytest.warns(RuntimeWarning, match=r"overflowed: \{'blocks.1.hook_resid_pre': (\d+)\}"):
        collect_activations(model, [TEXT], names=[RESID], out=out, dtype=torch.float16,
                            shard_contexts=4, progress=False)  # fmt: skip
    store = ActivationStore(out)
    rows = store.rows(RESID, slice(None))
    expected = int(torch.isinf(rows).sum())
    assert expected > 0 and store.manifest["infinities"][RESID] == expected


DISK_FULL_WORKER = """
import errno, json, sys, torch
sys.path.insert(0, {tests!r})
from helpers.store import RESID, byte_model
TEXT = {text!r}
from hookedattn.store import ActivationStore, collect_activations
out = sys.argv[1] + "/store"
try:
    collect_activations(byte_model(), [TEXT * 40], names=[RESID], out=out, shard_contexts=16,
                        progress=False)
    report = {{"error": None}}
except OSError as error:
    report = {{"error": error.errno, "message": str(error)}}
import os
store = ActivationStore(out)
report.update(complete=store.complete, rows=len(store), shards=len(store._shards),
              planned=store.n_shards_planned, files=sorted(os.listdir(out)),
              first=store.rows(RESID, slice(0, 4)).tolist())
print(json.dumps(report))
"""


def test_a_full_disk_is_a_clear_error_and_the_store_stays_readable(tmp_path):
    # A real full filesystem: a 96 KiB tmpfs mounted in a private user and mount namespace.
    if shutil.which("unshare") is None:
        pytest.skip("needs util-linux unshare to mount a small tmpfs without root")
    (tmp_path / "disk").mkdir()
    worker = tmp_path / "worker.py"
    worker.write_text(DISK_FULL_WORKER.format(tests=str(ROOT / "tests"), text=TEXT))
    script = f'mount -t tmpfs -o size=96k tmpfs "$1" && exec "{sys.executable}" "{worker}" "$1"'
    command = ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script, "sh"]
    done = subprocess.run([*command, str(tmp_path / "disk")], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)  # fmt: skip
    if done.returncode != 0 and "mount" in done.stderr and "Traceback" not in done.stderr:
        pytest.skip(f"cannot mount a tmpfs in a user namespace here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["error"] == 28, report  # ENOSPC
    assert "no space left" in report["message"] and "rerun the same collection" in report["message"]
    assert not report["complete"] and 0 < report["shards"] < report["planned"]
    assert report["rows"] == report["shards"] * 16 * 8
    assert not [f for f in report["files"] if ".tmp-" in f]  # the half-written shard is gone
    model = byte_model()
    expected = model.run_with_cache(torch.tensor([[256, *TEXT.encode()[:7]]]), names_filter=RESID)
    torch.testing.assert_close(torch.tensor(report["first"]), expected[1][RESID][0, :4].float())
