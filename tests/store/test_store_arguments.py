"""The store's fingerprint and arguments: a collection stores the model's own activations or
is refused, every number is checked before anything is written, row indices are never
truncated or flattened, and a refused second writer touches nothing."""

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from helpers.store import RESID, byte_model

from hookedattn.store import ActivationStore, StoreError, collect_activations

TEXT = "import os\nprint(os.getcwd())\n" * 4
OPTIONS = dict(names=[RESID], batch_size=2, shard_contexts=4, progress=False)
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> ActivationStore:
    out = tmp_path_factory.mktemp("store") / "s"
    collect_activations(byte_model(), [TEXT], out=out, **OPTIONS)
    return ActivationStore(out)


# ------------------------------------------------------------------ hooks
def test_a_model_with_a_permanent_hook_is_refused(tmp_path):
    """Guards: a store collected with an edit hook passed ActivationStore(d, model=m), and a
    resumed run could mix edited and clean shards (hooks are not in the fingerprint)."""
    model = byte_model()
    model.add_hook(RESID, lambda x, hook: x * 2, is_permanent=True)
    with pytest.raises(ValueError, match=r"1 hook\(s\) are attached \(<lambda> at " + RESID):
        collect_activations(model, [TEXT], out=tmp_path / "s", **OPTIONS)
    assert not (tmp_path / "s").exists()


def test_a_model_inside_a_hooks_block_is_refused(tmp_path):
    """Guards: scoped hooks edit the activations just as well."""
    model = byte_model()
    with (
        model.hooks([("blocks.0.hook_resid_post", lambda x, hook: x + 1)]),
        pytest.raises(ValueError, match=r"hook\(s\) are attached .* leave the `with` block"),
    ):
        collect_activations(model, [TEXT], out=tmp_path / "s", **OPTIONS)


# ------------------------------------------------------------------ numbers
@pytest.mark.parametrize(
    ("argument", "value"),
    [("shard_contexts", -16), ("shard_contexts", 0), ("shard_contexts", True), ("batch_size", 0)],
)
def test_shard_and_batch_sizes_must_be_positive_ints(tmp_path, argument, value):
    """Guards: shard_contexts=-16 wrote a "complete" store of 0 rows; 0 a raw traceback."""
    options = {**OPTIONS, argument: value}
    with pytest.raises(ValueError, match=rf"{argument} must be a positive int, got {value!r}"):
        collect_activations(byte_model(), [TEXT], out=tmp_path / "s", **options)
    assert not (tmp_path / "s").exists()


@pytest.mark.parametrize(("argument", "value"), [("shard_contexts", 2.5), ("batch_size", 1.5)])
def test_float_sizes_are_refused_not_truncated(argument, value):
    """Guards: a float size reached range() or was truncated. (Through collect_activations
    the suite's beartype refuses a float by its annotation first; this is the check that
    runs without it.)"""
    from hookedattn.store.collection import _check_options

    sizes = {"batch_size": 2, "shard_contexts": None, argument: value}
    with pytest.raises(ValueError, match=rf"{argument} must be a positive int, got {value}"):
        _check_options(torch.float32, sizes["batch_size"], sizes["shard_contexts"])


@pytest.mark.parametrize("n_tokens", [float("inf"), float("nan"), -1, 0, True, -0.5])
def test_n_tokens_must_be_a_positive_finite_number(tmp_path, n_tokens):
    """Guards: inf gave OverflowError, nan a bare 'cannot convert float NaN to integer'."""
    with pytest.raises(ValueError, match=r"n_tokens must be a positive, finite number"):
        collect_activations(byte_model(), [TEXT], out=tmp_path / "s", n_tokens=n_tokens, **OPTIONS)


@pytest.mark.parametrize("context", [True, 9])
def test_context_must_be_an_int_in_range(tmp_path, context):
    """Guards: context=True was taken as 1 (and 7.9 was truncated to 7, which the suite's
    beartype refuses by the annotation before our check runs)."""
    with pytest.raises(ValueError, match=rf"context must be an int in 2..8 .*got {context!r}"):
        collect_activations(byte_model(), [TEXT], out=tmp_path / "s", context=context, **OPTIONS)


def collect_script():
    spec = importlib.util.spec_from_file_location("collect_script", ROOT / "scripts" / "collect.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--tokens", "inf"), ("--tokens", "nan"), ("--tokens", "-5"), ("--shard-contexts", "-1"),
     ("--shard-contexts", "0"), ("--batch-size", "2.5")],
)  # fmt: skip
def test_collect_py_refuses_bad_numbers_before_loading_anything(tmp_path, capsys, flag, value):
    """Guards: `collect.py --shard-contexts -1` wrote an empty "complete" store, and
    `--tokens inf/nan` printed raw tracebacks."""
    argv = ["--model", "no-such-model", "--names", RESID, "--out", str(tmp_path / "s"), flag, value]
    with pytest.raises(SystemExit) as exit_:
        collect_script().main(argv)
    assert exit_.value.code == 2
    assert f"argument {flag}: must be a positive" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


# ------------------------------------------------------------------ row indices
def test_an_int_index_gives_one_row_and_an_index_tensor_keeps_its_shape(store):
    """Guards: a 2-D index was flattened; now rows(name, index) is indexed as numpy does."""
    everything = store.rows(RESID, slice(None))
    assert torch.equal(store.rows(RESID, 5), everything[5])
    index = torch.tensor([[0, 9, 40], [63, -1, 17]])
    rows = store.rows(RESID, index)
    assert rows.shape == (2, 3, 16) and torch.equal(rows, everything[index])
    assert torch.equal(store.rows(RESID, [[1, 2]]), everything[torch.tensor([[1, 2]])])
    origin = store.origin(index)
    assert origin.position.shape == (2, 3) and origin.position.tolist() == (index % 8 % 64).tolist()
    assert store.rows(RESID, []).shape == (0, 16)
    one = store.origin(13)
    assert one.position.shape == () and (int(one.context), int(one.position)) == (1, 5)


@pytest.mark.parametrize(
    "index", [2.7, torch.tensor([1.0, 2.0]), [0.5], True, torch.tensor([True])]
)
def test_float_and_bool_indices_are_refused_not_truncated(store, index):
    """Guards: rows(name, 2.7) returned row 2."""
    with pytest.raises(TypeError, match=r"row indices"):
        store.rows(RESID, index)


@pytest.mark.parametrize("bad", ["n in a tensor", "n", "2**70", "-2**70"])
def test_an_out_of_range_index_names_the_row_and_the_range(store, bad):
    """Guards: an IndexError that did not say which row; past int64, a TypeError about an
    overflow in unpacking."""
    n = len(store)
    index = {"n in a tensor": torch.tensor([3, n]), "n": n, "2**70": 2**70, "-2**70": -(2**70)}
    row = {"n in a tensor": n, "n": n, "2**70": 2**70, "-2**70": -(2**70)}[bad]
    with pytest.raises(IndexError, match=rf"row {row} is out of range .* \(valid: -{n}..{n - 1}\)"):
        store.rows(RESID, index[bad])


# ------------------------------------------------------------------ a second writer
def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_refused_second_writer_deletes_no_temporary_file(tmp_path):
    """Guards: a writer refused because the folder holds another collection first deleted
    every .*.tmp-* file there, the live writer's shard in flight included."""
    out = tmp_path / "s"
    collect_activations(byte_model(), [TEXT], out=out, **OPTIONS)
    live = out / f".shard-00009.safetensors.tmp-{socket.gethostname()}-{os.getpid()}"
    live.write_bytes(b"in flight")
    with pytest.raises(StoreError, match=r"holds another collection"):
        collect_activations(byte_model(), [TEXT], out=out, **{**OPTIONS, "names": ["hook_embed"]})
    assert live.read_bytes() == b"in flight"


def test_a_killed_writers_temporary_file_is_removed_and_a_live_ones_is_kept(tmp_path):
    """Guards: stale files of a writer that is gone are cleaned, a live writer's never."""
    out = tmp_path / "s"
    collect_activations(byte_model(), [TEXT], out=out, **OPTIONS)
    host = socket.gethostname()
    live = out / f".shard-00001.safetensors.tmp-{host}-{os.getpid()}"
    stale = out / f".shard-00002.safetensors.tmp-{host}-{dead_pid()}"
    other_host = out / f".shard-00003.safetensors.tmp-elsewhere.example-{dead_pid()}"
    for path in (live, stale, other_host):
        path.write_bytes(b"x")
    again = collect_activations(byte_model(), [TEXT], out=out, **OPTIONS)
    assert again.written == () and live.exists() and other_host.exists() and not stale.exists()


@pytest.mark.parametrize(("argument", "value"), [("window", 0), ("window", True)])
def test_batch_sizes_and_windows_are_positive_ints(store, argument, value):
    """Guards: window=True was taken as 1 (batch_size=2.5 failed in range() with "'float'
    object cannot be interpreted as an integer"; the suite's beartype refuses it first)."""
    kwargs = {"batch_size": 4, "shuffle": True, argument: value}
    with pytest.raises(ValueError, match=rf"{argument} must be a positive int, got {value!r}"):
        next(store.batches(RESID, **kwargs))


def test_load_sweep_of_a_file_that_is_not_one_names_it(tmp_path):
    """Guards: a bare SafetensorError from the Rust reader."""
    from hookedattn.store import load_sweep

    (tmp_path / "notes.safetensors").write_text("not a sweep")
    with pytest.raises(ValueError, match=r"notes.safetensors is not a saved sweep"):
        load_sweep(tmp_path / "notes.safetensors")
