"""HF import runs no code from a model folder and reads nothing outside it; a malformed
index or config, weights of the wrong kind and a missing device are named.

A folder whose `config.json` (or `tokenizer_config.json`) names custom code through
`auto_map` holds a Python file that writes a marker when imported. `from_hf` must refuse it
by name, at once, in a child process with a pseudo-terminal attached (where transformers
asked "run the custom code? [y/N]"; the test answers "y", as a person might) and with its
stdin closed; the marker must never appear.
"""

import json
import os
import pty
import select
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from hookedattn import CheckpointError, HookedTransformer

transformers = pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
EVIL_CODE = """
import pathlib
pathlib.Path({marker!r}).write_text("the folder's code ran")
from transformers import GPT2Config, PreTrainedTokenizerFast

class EvilConfig(GPT2Config):
    model_type = "evil"

class EvilTokenizer(PreTrainedTokenizerFast):
    pass
"""
CHILD = """
import sys
from hookedattn import HookedTransformer
try:
    HookedTransformer.from_hf(sys.argv[1])
except Exception as error:
    print("REFUSED", type(error).__name__, error)
    sys.exit(3)
print("LOADED")
"""


def tiny_gpt2_dir(path: Path) -> Path:
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=16, vocab_size=32)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(path)
    return path


def evil_folder(path: Path, marker: Path, where: str) -> Path:
    """A folder whose config (`where="config"`: unknown model type, code for it) or tokenizer
    config (`where="tokenizer"`: a real GPT-2 folder otherwise) names its own code."""
    code = EVIL_CODE.format(marker=str(marker))
    if where == "config":
        path.mkdir()
        auto_map = {"AutoConfig": "configuration_evil.EvilConfig"}
        (path / "config.json").write_text(json.dumps({"model_type": "evil", "auto_map": auto_map}))
        (path / "configuration_evil.py").write_text(code)
    else:
        tiny_gpt2_dir(path)
        auto_map = {"AutoTokenizer": [None, "tokenization_evil.EvilTokenizer"]}
        (path / "tokenizer_config.json").write_text(json.dumps({"auto_map": auto_map}))
        (path / "tokenization_evil.py").write_text(code)
    return path


def child_env() -> dict[str, str]:
    # This checkout's hookedattn, offline, and no answer to any prompt from the environment.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    env.pop("TRUST_REMOTE_CODE", None)
    return env


def run_with_a_terminal(folder: Path, timeout: float = 120) -> tuple[str, float]:
    """Run the child on a pseudo-terminal, typing "y" (a person saying yes to any prompt);
    its output and how long it took."""
    started = time.monotonic()
    pid, fd = pty.fork()
    if pid == 0:  # the child: stdin, stdout and stderr are the terminal
        os.execve(sys.executable, [sys.executable, "-c", CHILD, str(folder)], child_env())
    os.write(fd, b"y\n")
    output = b""
    while time.monotonic() - started < timeout:
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            output += chunk
    else:
        os.kill(pid, 9)
    os.waitpid(pid, 0)
    return output.decode(errors="replace"), time.monotonic() - started


@pytest.mark.parametrize("where", ["config", "tokenizer"])
def test_custom_code_is_refused_on_a_terminal_even_when_someone_says_yes(tmp_path, where):
    """Guards: on a terminal transformers asked "run the custom code? [y/N]" and ran the
    folder's Python on "y"."""
    marker = tmp_path / "marker"
    folder = evil_folder(tmp_path / "model", marker, where)
    output, _ = run_with_a_terminal(folder)
    assert not marker.exists(), output
    assert "REFUSED CheckpointError" in output and "names custom code (auto_map" in output, output
    assert "[y/N]" not in output, output


@pytest.mark.parametrize("where", ["config", "tokenizer"])
def test_custom_code_is_refused_with_stdin_closed(tmp_path, where):
    """Guards: without a terminal the decision was still transformers' to make."""
    marker = tmp_path / "marker"
    folder = evil_folder(tmp_path / "model", marker, where)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder)],
        stdin=subprocess.DEVNULL if where == "tokenizer" else None,
        preexec_fn=(lambda: os.close(0)) if where == "config" else None,
        capture_output=True, text=True, timeout=120, env=child_env(),
    )  # fmt: skip
    assert not marker.exists(), done.stdout + done.stderr
    assert done.returncode == 3 and "names custom code (auto_map" in done.stdout, done


def test_a_supported_model_type_with_auto_map_is_refused_too(tmp_path):
    """Guards: auto_map beside a known model type was left to transformers to weigh."""
    folder = tiny_gpt2_dir(tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel"}
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config.json names custom code"):
        HookedTransformer.from_hf(folder)


# ------------------------------------------------------------------ files outside the folder
def sharded(folder: Path) -> Path:
    """A folder whose weights are listed by a model.safetensors.index.json."""
    tiny_gpt2_dir(folder)
    names = list(load_file(str(folder / "model.safetensors")))
    index = {"metadata": {}, "weight_map": dict.fromkeys(names, "model.safetensors")}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    return folder


def test_an_index_entry_outside_the_folder_is_refused(tmp_path):
    """Guards: `../elsewhere/model.safetensors` loaded weights from outside the folder."""
    folder = sharded(tmp_path / "model")
    (tmp_path / "elsewhere").mkdir()
    shutil.move(folder / "model.safetensors", tmp_path / "elsewhere" / "model.safetensors")
    index = json.loads((folder / "model.safetensors.index.json").read_text())
    index["weight_map"] = dict.fromkeys(index["weight_map"], "../elsewhere/model.safetensors")
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(
        CheckpointError, match=r"'\.\./elsewhere/model.safetensors', which is not a file inside"
    ):
        HookedTransformer.from_hf(folder)


@pytest.mark.parametrize("text", ['{"weight_map": {', "[1, 2]", '{"weight_map": 5}'])
def test_a_malformed_index_names_the_file(tmp_path, text):
    """Guards: a bare JSONDecodeError without the file's name."""
    folder = sharded(tmp_path / "model")
    (folder / "model.safetensors.index.json").write_text(text)
    with pytest.raises(CheckpointError, match=r"model.safetensors.index.json"):
        HookedTransformer.from_hf(folder)


def test_a_malformed_config_names_the_file(tmp_path):
    """Guards: a bare JSONDecodeError from transformers."""
    folder = tiny_gpt2_dir(tmp_path / "model")
    (folder / "config.json").write_text('{"model_type": "gpt2",')
    with pytest.raises(CheckpointError, match=r"config.json is not valid JSON"):
        HookedTransformer.from_hf(folder)


@pytest.mark.parametrize("dtype", [torch.int32, torch.bool, torch.complex64])
def test_integer_bool_and_complex_weights_are_refused_not_cast(tmp_path, dtype):
    """Guards: int, bool and complex weights were cast to float without a word."""
    folder = tiny_gpt2_dir(tmp_path / "model")
    tensors = load_file(str(folder / "model.safetensors"))
    name = "transformer.h.0.attn.c_attn.weight"
    tensors[name] = tensors[name].to(dtype)
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=rf"not floating point .*{name}: {dtype}"):
        HookedTransformer.from_hf(folder)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_a_device_this_machine_lacks_is_named_with_the_remedy(tmp_path):
    """Guards: device='cuda' without CUDA gave torch's raw assertion."""
    folder = tiny_gpt2_dir(tmp_path / "model")
    with pytest.raises(CheckpointError, match=r"device 'cuda' is not available .* device='cpu'"):
        HookedTransformer.from_hf(folder, device="cuda")
