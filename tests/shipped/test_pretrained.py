"""The shipped models: listed, loaded offline, reproducible from their recipe, checked."""

import fnmatch
import re
import shutil
import tomllib
from pathlib import Path

import pytest
import torch

from analysis import logit_lens
from hookedattn import CheckpointError, HookedTransformer, list_pretrained
from hookedattn.core._pretrained import (
    PRETRAINED_DIR,
    load_pretrained,
    pretrained_info,
    write_index,
)
from hookedattn.core.hub import NotCachedError
from hookedattn.training.presets import PRESETS

REPO = Path(__file__).resolve().parents[2]
REQUIRED = {"bytes-attn-only-0l", "bytes-attn-only-1l", "bytes-attn-only-2l", "bytes-gelu-2l"}


def test_the_required_models_are_shipped():
    assert {info.name for info in list_pretrained()} >= REQUIRED


def test_the_shipped_models_are_small():
    # 8 MiB: the two-layer model ships a checkpoint every 50 steps through its phase change
    # (about 0.45 MB each), so that its timing is measured on more than a handful of points.
    total = sum(p.stat().st_size for p in PRETRAINED_DIR.rglob("*") if p.is_file())
    assert total < 8 * 2**20


def test_every_shipped_model_is_what_its_documented_command_makes():
    for info in list_pretrained():
        preset = PRESETS[info.name]
        assert info.config == preset.model, info.name
        assert info.training["train_config"] == preset.train.to_dict() | {
            "betas": list(preset.train.betas),
            "synthetic_period": list(preset.train.synthetic_period),
        }
        assert info.training["command"] == f"python scripts/train.py --preset {info.name}"
        assert info.training["step"] == preset.train.steps == info.checkpoints[-1]
        shipped = {s for s in preset.shipped_checkpoints if s < preset.train.steps}
        assert set(info.checkpoints[:-1]) == shipped


def test_the_package_data_globs_cover_every_shipped_file():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    globs = pyproject["tool"]["setuptools"]["package-data"]["hookedattn"]
    package = REPO / "hookedattn"
    for path in PRETRAINED_DIR.rglob("*"):
        if path.is_file():
            relative = path.relative_to(package).as_posix()
            assert any(fnmatch.fnmatch(relative, g) for g in globs), relative


def test_from_pretrained_loads_a_model_that_reads_text():
    model = HookedTransformer.from_pretrained("bytes-attn-only-2l")
    assert model.cfg.n_layers == 2 and model.cfg.attn_only
    prompt = "def __init__(self):"
    logits = model(prompt)
    assert logits.shape == (1, len(prompt) + 1, model.cfg.d_vocab_out)  # <bos> + one per byte
    assert torch.isfinite(logits).all()


def test_checkpoints_load_by_step_and_by_index():
    info = pretrained_info("bytes-attn-only-2l")
    first = HookedTransformer.from_pretrained(
        "bytes-attn-only-2l", checkpoint_value=info.checkpoints[0]
    )
    same = HookedTransformer.from_pretrained("bytes-attn-only-2l", checkpoint_index=0)
    final = HookedTransformer.from_pretrained("bytes-attn-only-2l", checkpoint_index=-1)
    assert torch.equal(first.W_Q, same.W_Q)
    assert torch.equal(final.W_Q, HookedTransformer.from_pretrained("bytes-attn-only-2l").W_Q)
    assert not torch.equal(first.W_Q, final.W_Q)


def test_an_unknown_name_lists_the_available_ones():
    # Offline (as the suite runs), a name that is no shipped model is not in the hub cache.
    with pytest.raises(
        NotCachedError, match=r"no shipped model.*Did you mean 'bytes-attn-only-2l'"
    ):
        HookedTransformer.from_pretrained("bytes-attn-only-2L")


@pytest.mark.parametrize(
    ("name", "repo_id"),
    [
        ("attn-only-2l", "NeelNanda/Attn_Only_2L512W_C4_Code"),
        ("gelu-2l", "NeelNanda/GELU_2L512W_C4_Code"),
        ("gpt2-small", "gpt2"),
        ("pythia-70m", "EleutherAI/pythia-70m"),
    ],
)
def test_a_transformerlens_name_means_its_hub_repo(name, repo_id):
    with pytest.raises(NotCachedError, match=rf"^{re.escape(repo_id)} at revision 'main'"):
        HookedTransformer.from_pretrained(name)


def test_the_logit_lens_of_a_shipped_model_shows_its_tokens():
    model = HookedTransformer.from_pretrained("bytes-attn-only-2l")
    _, cache = model.run_with_cache("import os")
    table = logit_lens(model, cache).top(3)
    first = table.rows[0][1]  # "'x' (1.23)": a quoted string, then its logit
    assert first.startswith("'") and "(" in first, table


def test_an_unknown_checkpoint_lists_the_steps():
    with pytest.raises(ValueError, match=r"no checkpoint at step 7; steps: \["):
        HookedTransformer.from_pretrained("bytes-attn-only-2l", checkpoint_value=7)
    with pytest.raises(ValueError, match="out of range"):
        HookedTransformer.from_pretrained("bytes-attn-only-2l", checkpoint_index=99)


@pytest.fixture
def shipped_copy(tmp_path):
    shutil.copytree(PRETRAINED_DIR / "bytes-attn-only-1l", tmp_path / "bytes-attn-only-1l")
    write_index(tmp_path)
    return tmp_path


def test_a_copy_with_its_index_loads(shipped_copy):
    model = load_pretrained(HookedTransformer, "bytes-attn-only-1l", directory=shipped_copy)
    assert torch.equal(model.W_Q, HookedTransformer.from_pretrained("bytes-attn-only-1l").W_Q)


def test_a_truncated_weights_file_is_reported(shipped_copy):
    weights = shipped_copy / "bytes-attn-only-1l" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match=r"corrupted or truncated.*retrain it with"):
        load_pretrained(HookedTransformer, "bytes-attn-only-1l", directory=shipped_copy)


def test_a_flipped_byte_is_reported(shipped_copy):
    weights = shipped_copy / "bytes-attn-only-1l" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-5] ^= 0xFF  # inside a tensor: the file still parses, only the hash can tell
    weights.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupted or truncated"):
        load_pretrained(HookedTransformer, "bytes-attn-only-1l", directory=shipped_copy)


def test_a_missing_file_is_reported(shipped_copy):
    (shipped_copy / "bytes-attn-only-1l" / "config.json").unlink()
    with pytest.raises(CheckpointError, match="is missing"):
        load_pretrained(HookedTransformer, "bytes-attn-only-1l", directory=shipped_copy)


def test_a_directory_without_models_says_how_to_make_them(tmp_path):
    with pytest.raises(FileNotFoundError, match="scripts/train.py --preset"):
        list_pretrained(tmp_path)
