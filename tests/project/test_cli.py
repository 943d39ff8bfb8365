"""`python -m hookedattn`, run as a user would: in a subprocess; and its bad arguments, each
an `error:` line naming the limit (exit status 2), in this process."""

import argparse
import subprocess
import sys

import pytest
import torch

from hookedattn import HookedTransformer, list_pretrained
from hookedattn.__main__ import main as cli
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
    # Offline (as the suite runs), so a hub name is looked for in the (empty) cache.
    done = _cli("predict", "bytes-attn-only-3l", "x")
    assert done.returncode == 2
    assert "bytes-attn-only-2l" in done.stderr and "HF_HUB_OFFLINE" in done.stderr
    done = _cli("predict", "attn-only-3l", "x")
    assert done.returncode == 2
    assert "NeelNanda/Attn_Only_3L512W_C4_Code at revision 'main'" in done.stderr


def test_an_unknown_activation_suggests_close_names():
    done = _cli("cache", "bytes-attn-only-2l", "x", "patern", "1")
    assert done.returncode == 2
    assert "did you mean 'pattern'" in done.stderr


# ------------------------------------------------------------ bad arguments, in process
SHIPPED = "bytes-attn-only-2l"


def test_cache_precision_is_bounded(capsys):
    """Guards: `cache --precision 100000000` allocated until killed."""
    with pytest.raises(SystemExit) as exit_:
        cli(["cache", SHIPPED, "ab", "pattern", "1", "--precision", "100000000"])
    assert exit_.value.code == 2
    assert "argument --precision: must be an int 0..20, got '100000000'" in capsys.readouterr().err


@pytest.mark.parametrize("k", ["0", "-5", "many"])
def test_predict_k_must_be_positive(capsys, k):
    """Guards: `predict -k -5` gave torch's raw topk error."""
    with pytest.raises(SystemExit):
        cli(["predict", SHIPPED, "ab", "-k", k])
    assert "argument -k: must be an int >= 1" in capsys.readouterr().err


def test_view_max_values_reaches_the_page(tmp_path, capsys):
    """Guards: the CLI's page is held to --max-values, and the message says how to raise it."""
    assert (
        cli(["view", SHIPPED, "abcabc", "-o", str(tmp_path / "a.html"), "--max-values", "10"]) == 2
    )
    assert "more than max_values=10" in capsys.readouterr().err
    assert not (tmp_path / "a.html").exists()


@pytest.mark.parametrize("where", ["a folder", "under /proc", "a missing folder"])
def test_an_output_path_that_cannot_be_written_is_named(tmp_path, capsys, where):
    """Guards: a folder, an unwritable path or one under /proc printed a raw traceback
    (`__main__` caught only FileNotFoundError)."""
    out = {
        "a folder": tmp_path,
        "under /proc": "/proc/attention.html",
        "a missing folder": tmp_path / "missing" / "a.html",
    }[where]
    assert cli(["view", SHIPPED, "ab", "-o", str(out)]) == 2
    assert f"error: cannot write the page to {out}" in capsys.readouterr().err


def test_every_option_says_what_it_is():
    from hookedattn.__main__ import parser

    commands = next(a for a in parser()._actions if isinstance(a, argparse._SubParsersAction))
    silent = [
        f"{name} {'/'.join(action.option_strings)}"
        for name, sub in commands.choices.items()
        for action in sub._actions
        if action.option_strings and not action.help
    ]
    assert silent == []
