"""Checkpoints: safetensors + JSON config, round trip, and clear errors for bad files; hostile
or broken ones refused with an error naming what is wrong, before a config can make us
allocate anything, and weights of the wrong kind never loaded."""

import json
import math
from functools import partial
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from hookedattn import CheckpointError, HookedTransformer, HookedTransformerConfig
from hookedattn.core import _weights_io
from hookedattn.core._weights_io import TensorHeader, read_safetensors_header
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


# ------------------------------------------------------------ hostile or broken files
FIELDS = dict(n_layers=2, d_model=16, n_heads=4, n_ctx=8, d_vocab=20, d_mlp=32, seed=0)


def saved(tmp_path: Path, **overrides) -> Path:
    HookedTransformer(HookedTransformerConfig(**(FIELDS | overrides))).save(tmp_path)
    return tmp_path


def edit_config(path: Path, **fields) -> None:
    data = json.loads((path / "config.json").read_text())
    data["config"].update(fields)
    (path / "config.json").write_text(json.dumps(data))


def edit_weights(path: Path, edit) -> None:
    tensors = dict(HookedTransformer.load(path).state_dict())
    edit(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path / "model.safetensors"))


class NeverBuilt(HookedTransformer):
    """A model class whose construction fails the test: nothing may be built."""

    def __init__(self, *args, **kwargs):
        raise AssertionError("the model was built before the checkpoint was checked")


# ------------------------------------------------------------------ the header
def test_the_header_gives_names_shapes_and_dtypes(tmp_path):
    path = saved(tmp_path)
    model = HookedTransformer.load(path)
    header = read_safetensors_header(path / "model.safetensors")
    assert header == {
        name: TensorHeader(tuple(t.shape), t.dtype) for name, t in model.state_dict().items()
    }
    shape, dtype = header["embed.W_E"]
    assert shape == (20, 16) and dtype == torch.float32


@pytest.mark.parametrize(
    "header",
    [
        (10**15).to_bytes(8, "little") + b"{}",  # a header longer than the file
        (5).to_bytes(8, "little") + b"[1,2]",  # not an object
        (5).to_bytes(8, "little") + b"{\xff\xfe}",  # not text
        None,  # a tensor whose shape asks for more bytes than the file has
    ],
)
def test_a_hostile_header_is_refused_without_reading_on(tmp_path, header):
    if header is None:
        entry = {"dtype": "F32", "shape": [10**10, 16], "data_offsets": [0, 64]}
        text = json.dumps({"embed.W_E": entry}).encode()
        header = len(text).to_bytes(8, "little") + text + bytes(64)
    (tmp_path / "model.safetensors").write_bytes(header)
    with pytest.raises(CheckpointError, match="model.safetensors"):
        read_safetensors_header(tmp_path / "model.safetensors")


# ------------------------------------------------ sizes the config cannot choose
@pytest.mark.parametrize(
    ("overrides", "fields", "named"),
    [
        ({}, {"d_vocab": 10**7}, "d_vocab=10000000, but embed.W_E is [20, 16]"),
        ({}, {"n_ctx": 10**6}, "n_ctx=1000000, but pos_embed.W_pos is [8, 16]"),
        ({}, {"n_layers": 10**5}, "n_layers=100000 in"),
        ({}, {"d_model": 4096, "d_head": 1024}, "d_model=4096, but embed.W_E is [20, 16]"),
        ({}, {"d_mlp": 10**6}, "d_mlp=1000000, but blocks.0.mlp.W_in is [16, 32]"),
        ({}, {"n_heads": 1, "d_head": 64}, "n_heads=1, but blocks.0.attn.W_Q"),
        (
            {"positional_embedding_type": "rotary"},
            {"n_ctx": 10**6},
            "is fixed by no weight",
        ),
    ],
)
def test_a_config_cannot_decide_how_much_memory_is_allocated(tmp_path, overrides, fields, named):
    path = saved(tmp_path, **overrides)
    edit_config(path, **fields)
    with pytest.raises(CheckpointError, match="config") as error:
        _weights_io.load(NeverBuilt, path)
    assert named in str(error.value)


def test_a_rotary_model_keeps_a_context_its_file_can_pay_for(tmp_path):
    path = saved(tmp_path, positional_embedding_type="rotary")
    edit_config(path, n_ctx=4096)  # a 16 MB mask: allowed, as a long-context model needs
    assert HookedTransformer.load(path).cfg.n_ctx == 4096


# ------------------------------------------------------- dtypes of the weights
@pytest.mark.parametrize("dtype", [torch.bool, torch.int64, torch.uint8, torch.complex64])
def test_weights_that_are_not_floating_point_are_refused_by_name(tmp_path, dtype):
    path = saved(tmp_path)
    edit_weights(path, lambda t: t.update({"embed.W_E": t["embed.W_E"].to(dtype)}))
    with pytest.raises(CheckpointError, match=rf"not floating point: embed.W_E \({dtype}\)"):
        _weights_io.load(NeverBuilt, path)


def test_load_checked_state_dict_refuses_them_too():
    model = HookedTransformer(HookedTransformerConfig(**FIELDS))
    state = dict(model.state_dict())
    state["embed.W_E"] = state["embed.W_E"] > 0
    with pytest.raises(CheckpointError, match=r"embed.W_E: torch.bool instead of torch.float32"):
        _weights_io.load_checked_state_dict(model, state)


def test_another_float_width_converts_only_when_asked(tmp_path):
    path = saved(tmp_path)
    expected = HookedTransformer.load(path).W_E.double()
    edit_weights(path, lambda t: t.update({k: v.double() for k, v in t.items()}))
    with pytest.raises(CheckpointError, match=r"not the config's torch.float32.*dtype="):
        _weights_io.load(NeverBuilt, path)
    model = _weights_io.load(HookedTransformer, path, dtype=torch.float64)
    assert model.cfg.dtype == torch.float64 and torch.equal(model.W_E, expected)
    model = _weights_io.load(HookedTransformer, path, dtype=torch.float32)
    assert model.W_E.dtype == torch.float32


# --------------------------------------------------------- every field on load
BAD_FIELDS = [
    ("eps", -1),
    ("eps", math.nan),
    ("attn_scale", 0),
    ("attn_scale", math.nan),
    ("use_attn_result", "false"),
    ("d_vocab_out", -1),
    ("d_mlp", True),
    ("init_range", "x"),
    ("seed", "abc"),
    ("act_fn", "gelu_neww"),
]


@pytest.mark.parametrize(("field", "value"), BAD_FIELDS)
def test_every_bad_field_in_a_file_is_a_checkpoint_error_naming_it(tmp_path, field, value):
    path = saved(tmp_path)
    edit_config(path, **{field: value})
    with pytest.raises(CheckpointError) as error:
        _weights_io.load(NeverBuilt, path)
    message = str(error.value)
    assert "config.json" in message and field in message and repr(value)[:3] in message


def test_deeply_nested_json_is_refused(tmp_path):
    path = saved(tmp_path)
    depth = 100_000
    (path / "config.json").write_text('{"config": ' + "[" * depth + "]" * depth + "}")
    with pytest.raises(CheckpointError, match="config.json is nested too deeply"):
        _weights_io.load(NeverBuilt, path)


def test_a_config_that_is_not_an_object_is_refused(tmp_path):
    path = saved(tmp_path)
    (path / "config.json").write_text('{"config": [1, 2, 3]}')
    with pytest.raises(CheckpointError, match="not a hookedattn config"):
        _weights_io.load(NeverBuilt, path)


@pytest.mark.parametrize("where", ["file", "argument"])
def test_a_device_this_machine_lacks_is_named_as_a_device_problem(tmp_path, where):
    path = saved(tmp_path)
    if where == "file":
        edit_config(path, device="cuda:99")
    kwargs = {"device": "cuda:99"} if where == "argument" else {}
    with pytest.raises(CheckpointError) as error:
        _weights_io.load(NeverBuilt, path, **kwargs)
    message = str(error.value)
    assert "device 'cuda:99' is not available on this machine" in message
    assert "corrupted" not in message
    assert ("asks for it" in message) == (where == "file")
