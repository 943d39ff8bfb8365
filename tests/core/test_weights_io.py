"""Checkpoints: safetensors + JSON config, round trip, and clear errors for bad files."""

import json
from functools import partial

import pytest
import torch

from hookedattn import CheckpointError, HookedTransformer
from hookedattn.testing import tiny_model

make_model = partial(tiny_model, n_heads=2, n_ctx=12, d_vocab=20, d_mlp=32, dtype=torch.float32)


@pytest.mark.parametrize(
    "overrides",
    [{}, {"attn_only": True, "positional_embedding_type": "rotary"}, {"dtype": "float64"}],
)
def test_save_then_load_rebuilds_the_same_model(tmp_path, overrides):
    model = make_model(**overrides)
    model.save(tmp_path / "ckpt")
    loaded = HookedTransformer.load(tmp_path / "ckpt")
    assert loaded.cfg == model.cfg
    tokens = torch.randint(0, 20, (2, 7))
    assert torch.equal(loaded(tokens), model(tokens))


def test_checkpoint_has_no_pickle(tmp_path):
    make_model().save(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    assert json.loads((tmp_path / "config.json").read_text())["config"]["d_model"] == 16


def test_missing_directory_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        HookedTransformer.load(tmp_path / "nowhere")


def test_missing_weights_file_is_an_error(tmp_path):
    make_model().save(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        HookedTransformer.load(tmp_path)


def test_truncated_weights_file_is_an_error(tmp_path):
    make_model().save(tmp_path)
    path = tmp_path / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-100])
    with pytest.raises(CheckpointError, match="truncated or corrupted"):
        HookedTransformer.load(tmp_path)


def test_corrupt_config_is_an_error(tmp_path):
    make_model().save(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not a valid config"):
        HookedTransformer.load(tmp_path)


def test_weights_that_do_not_match_the_config_are_listed(tmp_path):
    make_model().save(tmp_path)
    data = json.loads((tmp_path / "config.json").read_text())
    data["config"]["attn_only"] = True
    data["config"]["d_vocab"] = 21
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError) as error:
        HookedTransformer.load(tmp_path)
    # A size the weights fix is checked against the file's header, before anything is built.
    assert "d_vocab=21, but embed.W_E is [20, 16] (d_vocab 20)" in str(error.value)
    data["config"]["d_vocab"] = 20
    (tmp_path / "config.json").write_text(json.dumps(data))
    with pytest.raises(CheckpointError) as error:
        HookedTransformer.load(tmp_path)
    message = str(error.value)
    assert "unexpected" in message and "blocks.0.mlp.W_in" in message
