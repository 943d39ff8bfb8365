"""`python -m hookedattn`, run as a user would: in a subprocess."""

import subprocess
import sys

import torch

from hookedattn import HookedTransformer, list_pretrained
from hookedattn.core._pretrained import pretrained_info
from hookedattn.testing import tiny_model


def _cli(*args):
    command = [sys.executable, "-m", "hookedattn", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_list_shows_every_shipped_model_and_how_to_rebuild_it():
    done = _cli("list")
    assert done.returncode == 0, done.stderr
    for info in list_pretrained():
        assert info.name in done.stdout
        assert f"python scripts/train.py --preset {info.name} --ship" in done.stdout


def test_predict_shows_the_models_top_tokens_in_order():
    prompt = "def __init__(self):\n        self"
    done = _cli("predict", "bytes-attn-only-2l", prompt, "-k", "3")
    assert done.returncode == 0, done.stderr
    model = HookedTransformer.from_pretrained("bytes-attn-only-2l")
    with torch.no_grad():
        top = model(prompt)[0, -1].topk(3).indices.tolist()
    lines = [line for line in done.stdout.splitlines() if line.strip()[:2] in ("1.", "2.", "3.")]
    assert [int(line.split(" id ")[1].split()[0]) for line in lines] == top


def test_cache_prints_a_summary_of_every_activation():
    done = _cli("cache", "bytes-attn-only-2l", "import os")
    assert done.returncode == 0, done.stderr
    assert "ActivationCache" in done.stdout
    assert "blocks.1.attn.hook_pattern" in done.stdout and "(1, 8, 10, 10)" in done.stdout


def test_cache_prints_one_activation_by_shorthand():
    done = _cli("cache", "bytes-attn-only-2l", "ab", "pattern", "1", "--squeeze")
    assert done.returncode == 0, done.stderr
    assert "blocks.1.attn.hook_pattern: shape [1, 8, 3, 3]" in done.stdout
    assert "tensor(" in done.stdout


def test_a_checkpoint_from_the_shipped_run_can_be_chosen():
    done = _cli(
        "predict",
        "bytes-attn-only-2l",
        "x = 1",
        "--checkpoint",
        str(pretrained_info("bytes-attn-only-2l").checkpoints[0]),
        "-k",
        "1",
    )
    assert done.returncode == 0, done.stderr


def test_a_saved_model_directory_can_be_inspected(tmp_path):
    fields = dict(n_layers=1, d_model=8, n_heads=2, d_vocab=259, attn_only=True)
    tiny_model(dtype=torch.float32, **fields).save(tmp_path / "tiny")
    done = _cli("predict", str(tmp_path / "tiny"), "hi", "-k", "2")
    assert done.returncode == 0, done.stderr
    assert "top 2 next tokens" in done.stdout


def test_an_unknown_model_lists_the_available_ones():
    done = _cli("predict", "attn-only-3l", "x")
    assert done.returncode == 2
    assert "available: " in done.stderr and "bytes-attn-only-2l" in done.stderr
    assert "TransformerLens hub models" in done.stderr


def test_an_unknown_activation_suggests_close_names():
    done = _cli("cache", "bytes-attn-only-2l", "x", "patern", "1")
    assert done.returncode == 2
    assert "did you mean 'pattern'" in done.stderr
