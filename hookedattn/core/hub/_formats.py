"""Which kind of checkpoint a folder holds, and which of its files an import reads.

Three kinds of folder load (besides the shipped models): `hookedattn` (written by
`HookedTransformer.save`: `config.json` holds a `"config"` object), `transformers`
(`save_pretrained`: `config.json` names a `model_type`), and `transformerlens` (the
TransformerLens toy models: `config.json` holds TL's own fields, the weights a state dict
`*final.pth`). They are told apart by `config.json` alone, so a repo is fetched in two
steps: the small files first (`FIRST_FILES`), then the weights that kind reads.
"""

from pathlib import Path
from typing import Any

from hookedattn.core._weights_io import CheckpointError

FORMATS: tuple[str, ...] = ("hookedattn", "transformers", "transformerlens")
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_INDEX = "pytorch_model.bin.index.json"
# Every file a `transformers` tokenizer may be saved as (AutoTokenizer reads what is there).
TOKENIZER_FILES: tuple[str, ...] = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
)
FIRST_FILES: tuple[str, ...] = ("config.json", SAFETENSORS_INDEX, PICKLE_INDEX, *TOKENIZER_FILES)


def format_of(folder: Path) -> str:
    """The kind of checkpoint in `folder` (one of `FORMATS`), from its `config.json`."""
    from hookedattn.core.hf._loading import read_json

    config_file = folder / "config.json"
    if not config_file.is_file():
        held = sorted(p.name for p in folder.iterdir())[:12] if folder.is_dir() else []
        raise FileNotFoundError(
            f"no config.json in {folder} (it holds {held}): not a model folder; a model "
            f"folder is one written by HookedTransformer.save or save_pretrained, or a "
            f"TransformerLens toy model"
        )
    data = read_json(config_file)
    if isinstance(data.get("config"), dict):
        return "hookedattn"
    if "model_type" in data:
        return "transformers"
    if {"n_layers", "d_model", "n_heads"} <= data.keys():
        return "transformerlens"
    raise CheckpointError(
        f"{config_file} is none of the configs hookedattn reads ({', '.join(FORMATS)}): "
        f"it has no model_type (transformers), no config object (hookedattn) and no "
        f"n_layers/d_model/n_heads (TransformerLens); its keys: {sorted(data)[:12]}"
    )


def weight_names(folder: Path, kind: str, data: dict[str, Any] | None = None) -> list[str]:
    """The weight files (names or patterns) a checkpoint of `kind` in `folder` reads, as
    far as the small files say: the shards a safetensors index names, else the single
    file. A `transformers` repo with pickled weights only is found by `pickled_names`."""
    from hookedattn.core.hf._loading import read_json

    if kind == "hookedattn":
        return ["model.safetensors"]
    if kind == "transformers":
        index = folder / SAFETENSORS_INDEX
        if index.is_file():
            return _shards(read_json(index), index)
        return ["model.safetensors"]
    raise ValueError(f"weight_names reads {FORMATS[:2]} folders, not {kind!r}")


def pickled_names(folder: Path) -> list[str]:
    """The pickled weight files of a `transformers` folder (`pytorch_model*.bin`)."""
    from hookedattn.core.hf._loading import read_json

    index = folder / PICKLE_INDEX
    if index.is_file():
        return _shards(read_json(index), index)
    return ["pytorch_model.bin"]


def _shards(index: dict[str, Any], path: Path) -> list[str]:
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise CheckpointError(f"{path} has no weight_map (a tensor name -> file name object)")
    names = sorted({str(name) for name in weight_map.values()})
    for name in names:
        if Path(name).is_absolute() or ".." in Path(name).parts:
            raise CheckpointError(f"{path} names {name!r}, which is not a file of the repo")
    return names
