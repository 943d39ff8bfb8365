"""The training helper and scripts/train.py, on tiny configurations (a few steps each)."""

import dataclasses
import itertools
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core._pretrained import load_pretrained
from hookedattn.training import (
    TrainConfig,
    latest_checkpoint,
    learning_rate,
    list_checkpoints,
    train,
    training_batch,
)
from hookedattn.training.corpus import BOS, is_heldout, load_stdlib_corpus, repeated_random_tokens

REPO = Path(__file__).resolve().parents[2]
TINY = HookedTransformerConfig(
    n_layers=1, d_model=16, n_heads=2, d_head=8, n_ctx=16, d_vocab=259, attn_only=True,
    normalization_type=None, seed=0,
)  # fmt: skip
TINY_TRAIN = TrainConfig(
    steps=6, batch_size=4, warmup_steps=2, eval_every=3, eval_seqs=4, checkpoint_every=3
)


@pytest.fixture(autouse=True)
def one_thread():
    # Tiny models: a second thread only waits for the first (and spins on a busy machine).
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    # A small corpus of real Python files, so the tests do not depend on the stdlib's size.
    root = tmp_path_factory.mktemp("corpus")
    sources = sorted(Path(torch.__file__).parent.glob("*.py"))[:40]
    for source in sources:
        (root / source.name).write_bytes(source.read_bytes())
    return load_stdlib_corpus(root)


def test_learning_rate_warms_up_linearly_then_follows_a_cosine_to_the_floor():
    cfg = TrainConfig(steps=110, warmup_steps=10, lr=1e-3, min_lr_ratio=0.1)
    assert learning_rate(5, cfg) == pytest.approx(0.5e-3)
    assert learning_rate(10, cfg) == pytest.approx(1e-3)
    assert learning_rate(60, cfg) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))  # cos(pi/2) = 0
    assert learning_rate(110, cfg) == pytest.approx(1e-4)
    after_warmup = [learning_rate(s, cfg) for s in range(10, 111)]
    assert all(a >= b for a, b in itertools.pairwise(after_warmup))


def test_corpus_splits_every_file_by_its_name_and_keeps_its_bytes(corpus):
    manifest = corpus.manifest
    root = Path(manifest.root)
    files = sorted(p.name for p in root.glob("*.py"))
    assert sorted(manifest.train_files + manifest.heldout_files) == files
    assert all(is_heldout(name) for name in manifest.heldout_files)
    assert not any(is_heldout(name) for name in manifest.train_files)
    expected = b"".join((root / name).read_bytes() for name in manifest.heldout_files)
    assert bytes(corpus.heldout.to(torch.uint8).tolist()) == expected
    assert corpus.train.numel() == manifest.train_bytes


def test_a_corpus_with_no_held_out_file_is_an_error(tmp_path):
    name = next(f"m{i}.py" for i in range(100) if not is_heldout(f"m{i}.py"))
    (tmp_path / name).write_text("x = 1\n")
    with pytest.raises(ValueError, match="too few"):
        load_stdlib_corpus(tmp_path)


def test_repeated_random_tokens_repeat_with_their_period():
    tokens = repeated_random_tokens(8, 40, (3, 9), torch.Generator().manual_seed(0))
    assert tokens.shape == (8, 40) and (tokens[:, 0] == BOS).all()
    body = tokens[:, 1:]
    for row in body:
        period = next(p for p in range(3, 10) if torch.equal(row[p:], row[:-p]))
        assert 3 <= period <= 9


def test_batches_depend_only_on_seed_and_step(corpus):
    cfg = dataclasses.replace(TINY_TRAIN, synthetic_fraction=0.5)
    first = training_batch(corpus, cfg, 3, 16)
    assert torch.equal(first, training_batch(corpus, cfg, 3, 16))
    assert not torch.equal(first, training_batch(corpus, cfg, 4, 16))
    assert first.shape == (4, 16) and (first[:, 0] == BOS).all()


def _trained(corpus, run_dir=None, cfg=TINY_TRAIN):
    model = HookedTransformer(TINY)
    result = train(model, corpus, cfg, run_dir, progress=False)
    return model, result


def test_training_lowers_the_loss(corpus):
    cfg = dataclasses.replace(TINY_TRAIN, steps=30, eval_every=10, lr=1e-2)
    _, result = _trained(corpus, cfg=cfg)
    assert result.history[-1].heldout_loss < result.history[0].heldout_loss - 0.5
    assert result.history[0].heldout_loss < math.log(256) + 1


def test_training_is_deterministic(corpus):
    a, _ = _trained(corpus)
    b, _ = _trained(corpus)
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(x, y), name


def test_an_interrupted_run_resumes_to_the_same_weights(corpus, tmp_path):
    straight, _ = _trained(corpus)

    def interrupt(step, path):
        if step == 3:
            raise KeyboardInterrupt

    model = HookedTransformer(TINY)
    with pytest.raises(KeyboardInterrupt):
        train(model, corpus, TINY_TRAIN, tmp_path, progress=False, on_checkpoint=interrupt)
    assert [step for step, _ in list_checkpoints(tmp_path)] == [3]
    resumed = HookedTransformer(TINY)
    result = train(resumed, corpus, TINY_TRAIN, tmp_path, progress=False)
    assert result.resumed_from == 3 and result.step == 6
    assert [e.step for e in result.history] == [3, 6]
    for name, x in straight.state_dict().items():
        assert torch.equal(x, resumed.state_dict()[name]), name


def test_only_the_newest_checkpoint_keeps_optimizer_state(corpus, tmp_path):
    _trained(corpus, tmp_path)
    steps = [step for step, _ in list_checkpoints(tmp_path)]
    assert steps == [3, 6]
    assert latest_checkpoint(tmp_path).name == "step-000006"
    assert not (tmp_path / "checkpoints" / "step-000003" / "optimizer.safetensors").exists()


def test_resuming_with_another_config_is_an_error(corpus, tmp_path):
    _trained(corpus, tmp_path)
    with pytest.raises(ValueError, match="different TrainConfig"):
        _trained(corpus, tmp_path, dataclasses.replace(TINY_TRAIN, lr=0.5))


def _train_script(tmp_path, corpus, *extra):
    overrides = {"steps": 4, "batch_size": 4, "warmup_steps": 1, "eval_every": 2,
                 "checkpoint_every": 2, "eval_seqs": 4, "d_model": 16, "n_ctx": 16}  # fmt: skip
    command = [sys.executable, str(REPO / "scripts" / "train.py"), "--preset", "bytes-attn-only-2l",
               "--out", str(tmp_path / "run"), "--threads", "1",
               "--corpus-root", corpus.manifest.root, *extra]  # fmt: skip
    for field, value in overrides.items():
        command += ["--set", f"{field}={value}"]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=REPO)


def test_train_script_trains_ships_and_resumes(corpus, tmp_path):
    ship_dir = tmp_path / "shipped"
    done = _train_script(tmp_path, corpus, "--ship", "--ship-dir", str(ship_dir))
    assert done.returncode == 0, done.stderr
    assert "tok/s" in done.stderr and "shipped to" in done.stdout
    model = load_pretrained(HookedTransformer, "bytes-attn-only-2l", directory=ship_dir)
    assert model.cfg.n_ctx == 16 and model.cfg.n_layers == 2
    config = json.loads((ship_dir / "bytes-attn-only-2l" / "config.json").read_text())
    assert config["metadata"]["step"] == 4
    assert "--set steps=4" in config["metadata"]["command"]
    again = _train_script(tmp_path, corpus)
    assert again.returncode == 0, again.stderr
    assert "resumed from step 4" in again.stdout


def test_train_script_rejects_an_unknown_field(corpus, tmp_path):
    done = _train_script(tmp_path, corpus, "--set", "d_modle=3")
    assert done.returncode != 0 and "unknown field 'd_modle'" in done.stderr
