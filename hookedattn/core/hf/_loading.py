"""Reading a HuggingFace model directory without `from_pretrained`: its `config.json`
(through `transformers.AutoConfig`, which fills each family's defaults), its safetensors
files directly (headers first, then one memory-mapped tensor at a time), and its tokenizer
if one was saved there.

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

from hookedattn.core._weights_io import CheckpointError, read_safetensors_header

_INDEX = "model.safetensors.index.json"
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
