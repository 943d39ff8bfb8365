"""Reading a HuggingFace model directory without `from_pretrained`: its `config.json`
(through its family's config class, which fills the family's defaults), its safetensors
files directly (headers first, then one memory-mapped tensor at a time), and its tokenizer
if one was saved there.

Building the HF model first and converting it would hold two copies of the weights; reading
the files tensor by tensor holds the finished model plus the one tensor being converted.
Only local files are read: fetching a repo is `hookedattn.core.hub`'s.

Safetensors first. A folder with only pickled weights (`pytorch_model*.bin`, as older
repos have) is read with `torch.load(weights_only=True)`, which rebuilds tensors and
refuses anything else, so no code from the file runs; a warning says so, since those
files cannot be read a tensor at a time.

No code from the folder ever runs, and nobody is asked: a `config.json` or
`tokenizer_config.json` that names custom code (`auto_map`) is refused by name before
`transformers` reads it (it would prompt "run the custom code? [y/N]" on a terminal, and
run the folder's Python on "y"); the config is built by the family's own class, never by
`AutoConfig`, and the tokenizer is read with `trust_remote_code=False`. Weight files are
the ones in the folder: an index entry that leaves it (`../elsewhere/...`) is refused.
"""

import json
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor

from hookedattn.core._weights_io import MAX_CONFIG_BYTES, CheckpointError, read_safetensors_header

_INDEX = "model.safetensors.index.json"
_PICKLE_INDEX = "pytorch_model.bin.index.json"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")


def transformers_module() -> Any:
    """`transformers`, or an ImportError that says how to install it."""
    try:
        import transformers
    except ImportError as error:
        raise ImportError(
            "importing a HuggingFace model needs the `transformers` package: "
            "pip install 'hookedattn[hf]'"
        ) from error
    return transformers


class SafetensorsFiles:
    """The tensors of one or more safetensors files, as a `TensorSource`: names, shapes and
    dtypes from the headers (checked against the file sizes, nothing read or allocated),
    each tensor a view of its memory-mapped file when asked for.

    The view is the cheapest way in: converting it makes the one copy the model keeps (a
    reshape's `contiguous`, a cast, or a clone), and the file's pages leave the resident set
    once the view is dropped. Reading into a buffer first would be a second allocation per
    tensor, which the allocator keeps after it is freed.
    """

    def __init__(self, files: list[Path]) -> None:
        self._file: dict[str, Path] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, torch.dtype] = {}
        for file in files:
            for name, (shape, dtype) in read_safetensors_header(file).items():
                self._file[name] = file
                self.shapes[name], self.dtypes[name] = shape, dtype

    def get(self, name: str) -> Tensor:
        """The tensor called `name`, as stored: a view of the mapped file."""
        with safe_open(str(self._file[name]), framework="pt", device="cpu") as handle:
            return handle.get_tensor(name)

    def read_regions(self, name: str, regions: list[tuple[slice, ...]]) -> list[Tensor]:
        """The tensor `name` at each of `regions` (basic slices), through one mapping of its
        file: only the pages those regions cover are read. The file is unmapped once the
        returned tensors (views of it) are dropped."""
        with safe_open(str(self._file[name]), framework="pt", device="cpu") as handle:
            stored = handle.get_slice(name)
            return [stored[region] for region in regions]

    def stored_dtype(self) -> torch.dtype:
        """The floating dtype most tensors are stored in (what `dtype="auto"` loads)."""
        floating = [dtype for dtype in self.dtypes.values() if dtype.is_floating_point]
        return Counter(floating).most_common(1)[0][0] if floating else torch.float32


def check_directory(path: Path) -> None:
    """A FileNotFoundError unless `path` is a local model directory with a config.json."""
    if not path.is_dir():
        raise FileNotFoundError(
            f"no model directory at {path}: pass a directory holding config.json and "
            f"*.safetensors (one written by save_pretrained, or a hub snapshot), or a hub "
            f"repo id to HookedTransformer.from_hf"
        )
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no config.json in {path}: not a HuggingFace model directory")


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from `path`, or a `CheckpointError` naming the file and what is wrong."""
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise CheckpointError(f"{path} is larger than {MAX_CONFIG_BYTES >> 20} MiB: not a config")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as error:
        raise CheckpointError(f"{path} is not valid JSON ({error})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} holds {type(data).__name__}, not a JSON object")
    return data


def refuse_custom_code(path: Path, data: dict[str, Any]) -> None:
    """Refuse a config that names code of the folder's own (`auto_map`), without asking."""
    if "auto_map" in data:
        raise CheckpointError(
            f"{path} names custom code (auto_map: {json.dumps(data['auto_map'])[:200]}): "
            f"from_hf never runs code from a model folder, and never asks. Remove auto_map "
            f"if the model is one of the supported families, which need no code of their own"
        )


def read_config(path: Path) -> Any:
    """The directory's config, built from `config.json` by its family's config class (so
    the family's defaults are filled); a model type `transformers` does not know is named."""
    data = _special_floats(read_json(path / "config.json"))
    refuse_custom_code(path / "config.json", data)
    transformers = transformers_module()
    model_type = data.get("model_type")
    if not isinstance(model_type, str) or model_type not in transformers.CONFIG_MAPPING:
        raise ValueError(
            f"cannot read the config in {path} (model_type={model_type!r}): transformers "
            f"{transformers.__version__} knows no such model type"
        )
    try:
        return transformers.CONFIG_MAPPING[model_type].from_dict(data)
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(
            f"cannot read the config in {path} (model_type={model_type!r}): {error}"
        ) from error


def _special_floats(value: Any) -> Any:
    """`value` with the floats JSON cannot hold, which `save_pretrained` writes as
    `{"__float__": "Infinity"}` (Bamba's `time_step_limit`), read back as floats."""
    if isinstance(value, dict):
        tag = value.get("__float__") if len(value) == 1 else None
        if tag in ("Infinity", "-Infinity", "NaN"):
            return float(tag.lower().replace("infinity", "inf"))
        return {k: _special_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_special_floats(v) for v in value]
    return value


def weight_source(path: Path) -> Any:
    """The folder's weights as a `TensorSource`: its safetensors files, memory-mapped, or
    where it has none its pickled `pytorch_model*.bin`, read safely (module docstring)."""
    if (path / _INDEX).is_file() or any(path.glob("*.safetensors")):
        return SafetensorsFiles(safetensors_files(path))
    if (path / _PICKLE_INDEX).is_file() or any(path.glob("pytorch_model*.bin")):
        return PickledFiles(pickled_files(path))
    saved = sorted(p.name for p in path.iterdir())
    raise CheckpointError(
        f"no weights in {path} (it holds {saved}): from_hf reads *.safetensors (with "
        f"{_INDEX} if sharded) or pytorch_model*.bin; save the model with save_pretrained"
    )


def safetensors_files(path: Path) -> list[Path]:
    """The weight files: the shards an index names (each inside `path`), else every
    `*.safetensors` there."""
    index = path / _INDEX
    if index.is_file():
        return _indexed_files(path, index)
    files = sorted(path.glob("*.safetensors"))
    for file in files:
        _check_regular(file)
    if not files:
        saved = sorted(p.name for p in path.iterdir())
        raise CheckpointError(
            f"no *.safetensors in {path} (it holds {saved}): from_hf reads safetensors "
            f"(or pytorch_model*.bin); save the model with save_pretrained"
        )
    return files


def pickled_files(path: Path) -> list[Path]:
    """The pickled weight files: the shards `pytorch_model.bin.index.json` names, else
    every `pytorch_model*.bin`."""
    index = path / _PICKLE_INDEX
    files = (
        _indexed_files(path, index) if index.is_file() else sorted(path.glob("pytorch_model*.bin"))
    )
    for file in files:
        _check_regular(file)
    return files


class PickledFiles:
    """The tensors of pickled state-dict files (`pytorch_model*.bin`) as a `TensorSource`,
    read with `torch.load(weights_only=True, mmap=True)`: tensors only, never code."""

    def __init__(self, files: list[Path]) -> None:
        warnings.warn(
            f"{files[0].parent} has pickled weights only ({', '.join(f.name for f in files)}): "
            f"reading them with torch.load(weights_only=True), which runs no code from the "
            f"file; safetensors would load a tensor at a time",
            stacklevel=3,
        )
        self._tensors: dict[str, Tensor] = {}
        for file in files:
            self._tensors.update(_read_pickled(file))
        self.shapes = {name: tuple(t.shape) for name, t in self._tensors.items()}
        self.dtypes = {name: t.dtype for name, t in self._tensors.items()}

    def get(self, name: str) -> Tensor:
        """The tensor called `name`, as stored."""
        return self._tensors[name]

    def stored_dtype(self) -> torch.dtype:
        """The floating dtype most tensors are stored in."""
        floating = [dtype for dtype in self.dtypes.values() if dtype.is_floating_point]
        return Counter(floating).most_common(1)[0][0] if floating else torch.float32


def _read_pickled(file: Path) -> dict[str, Tensor]:
    try:
        state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:
        raise CheckpointError(
            f"{file} does not load as plain tensors (torch.load(weights_only=True) refused "
            f"it: {error}); hookedattn never unpickles anything else"
        ) from error
    if not isinstance(state, dict) or not all(
        isinstance(k, str) and isinstance(v, Tensor) for k, v in state.items()
    ):
        raise CheckpointError(f"{file} does not hold a state dict (names to tensors)")
    return state


def _check_regular(file: Path) -> None:
    """A `CheckpointError` unless `file` is a regular file (a FIFO or a device would block
    the header read forever, or never end)."""
    if not file.is_file():
        raise CheckpointError(
            f"{file} is not a regular file (a FIFO, a socket, a device or a folder): "
            f"from_hf reads weights from regular files only"
        )


def _indexed_files(path: Path, index: Path) -> list[Path]:
    weight_map = read_json(index).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{index} has no weight_map (a tensor name -> file name object)")
    files = []
    for name in sorted({*weight_map.values()}, key=str):
        relative = Path(name) if isinstance(name, str) else None
        # A hub snapshot's files are symlinks into its blob store: the name, not the link's
        # target, must stay inside the folder.
        if relative is None or relative.is_absolute() or ".." in relative.parts:
            raise CheckpointError(
                f"{index} names the weight file {name!r}, which is not a file inside {path}: "
                f"from_hf reads the model folder only"
            )
        if not (path / relative).is_file():
            raise CheckpointError(f"{index} names {name!r}, which is not in {path}")
        files.append(path / relative)
    return files


def saved_tokenizer(path: Path) -> Any:
    """The tokenizer saved in `path` by `transformers`, or None where none was saved."""
    # Only where tokenizer files were saved: `AutoTokenizer` would otherwise build an empty
    # one. A directory of weights alone gives a model that works on token ids.
    for name in _TOKENIZER_FILES:  # a FIFO among them would block the tokenizer's reader
        if (path / name).exists():
            _check_regular(path / name)
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        return None
    if (path / "tokenizer_config.json").is_file():
        refuse_custom_code(
            path / "tokenizer_config.json", read_json(path / "tokenizer_config.json")
        )
    # config.json was checked already; False is the answer to any question of custom code.
    return transformers_module().AutoTokenizer.from_pretrained(
        path, local_files_only=True, trust_remote_code=False
    )
