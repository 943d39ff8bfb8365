"""Reading a HuggingFace model directory without `from_pretrained`: its `config.json`
(through `transformers.AutoConfig`, which fills each family's defaults), its safetensors
files directly, one tensor at a time, and its tokenizer if one was saved there.

Building the HF model first and converting it would hold two copies of the weights; reading
the files tensor by tensor holds the finished model plus the one tensor being converted.
Only local files are read: nothing is downloaded.
"""

import json
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import Tensor

from hookedattn.weights_io import CheckpointError

_INDEX = "model.safetensors.index.json"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json")
_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
}


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
    """The tensors of one or more safetensors files, as a `TensorSource`: shapes from the
    headers, each tensor read from its file when asked for (and owned by the caller)."""

    borrowed = False

    def __init__(self, files: list[Path]) -> None:
        self._file: dict[str, Path] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.dtypes: dict[str, str] = {}
        for file in files:
            with safe_open(str(file), framework="pt", device="cpu") as handle:
                for name in handle.keys():  # noqa: SIM118 (a handle, not a dict)
                    view = handle.get_slice(name)
                    self._file[name] = file
                    self.shapes[name] = tuple(view.get_shape())
                    self.dtypes[name] = view.get_dtype()

    def get(self, name: str) -> Tensor:
        """The tensor called `name`, read from its file into memory of its own."""
        with safe_open(str(self._file[name]), framework="pt", device="cpu") as handle:
            return handle.get_tensor(name)

    def stored_dtype(self) -> torch.dtype:
        """The floating dtype most tensors are stored in (what `dtype="auto"` loads)."""
        counts = Counter(self.dtypes.values())
        for code, _ in counts.most_common():
            if code in _DTYPES:
                return _DTYPES[code]
        return torch.float32


def check_directory(path: Path) -> None:
    """A FileNotFoundError unless `path` is a local model directory with a config.json."""
    if not path.is_dir():
        raise FileNotFoundError(
            f"no model directory at {path}: from_hf reads local files only (nothing is "
            f"downloaded), so pass a directory holding config.json and *.safetensors, "
            f"e.g. one written by save_pretrained or a hub snapshot"
        )
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"no config.json in {path}: not a HuggingFace model directory")


def read_config(path: Path) -> Any:
    """The directory's config through `AutoConfig` (so each family's defaults are filled);
    a model type `transformers` does not know is named."""
    transformers = transformers_module()
    try:
        return transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    except (ValueError, KeyError) as error:
        model_type = json.loads((path / "config.json").read_text()).get("model_type")
        raise ValueError(
            f"cannot read the config in {path} (model_type={model_type!r}): {error}"
        ) from error


def safetensors_files(path: Path) -> list[Path]:
    """The weight files: the shards an index names, else every `*.safetensors` there."""
    index = path / _INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        return [path / name for name in sorted(set(weight_map.values()))]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        saved = sorted(p.name for p in path.iterdir())
        raise CheckpointError(
            f"no *.safetensors in {path} (it holds {saved}): from_hf reads safetensors "
            f"only; save the model with save_pretrained (transformers writes safetensors)"
        )
    return files


def saved_tokenizer(path: Path) -> Any:
    """The tokenizer saved in `path` by `transformers`, or None where none was saved."""
    # Only where tokenizer files were saved: `AutoTokenizer` would otherwise build an empty
    # one. A directory of weights alone gives a model that works on token ids.
    if not any((path / name).is_file() for name in _TOKENIZER_FILES):
        return None
    return transformers_module().AutoTokenizer.from_pretrained(path, local_files_only=True)
