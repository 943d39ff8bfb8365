"""From resolved files to a model: each kind of checkpoint through its one reader.

shipped           `_pretrained.load_pretrained`   (package data, SHA-256 checked)
hookedattn        `HookedTransformer.load`        (our config + safetensors)
transformers      `hf.from_hf`                    (the families' tables, verified)
transformerlens   `_transformerlens.load`         (TL's toy models)
"""

import os
from pathlib import Path
from typing import Any

import torch

from hookedattn.core import _pretrained, hf
from hookedattn.core.hf import _loading
from hookedattn.core.hub import _fetch, _formats, _transformerlens
from hookedattn.core.hub._fetch import HubOptions
from hookedattn.core.hub._resolve import Resolved, resolve


def load_model(
    cls: type,
    name: str | os.PathLike,
    options: HubOptions | None = None,
    *,
    checkpoint_index: int | None = None,
    checkpoint_value: int | None = None,
    dtype: torch.dtype | str | None = None,
    device: str | None = None,
    tokenizer: Any = None,
    verify: bool = True,
    **placement: Any,
) -> Any:
    """A `cls` (HookedTransformer) of the model `name` means (`resolve`), with its
    tokenizer (or `tokenizer`), in `dtype` (default: as stored) on `device`; a
    `transformers` checkpoint verified on load unless `verify=False` (`hf.from_hf`)."""
    options = HubOptions() if options is None else options
    found = resolve(
        name, options, checkpoint_index=checkpoint_index, checkpoint_value=checkpoint_value
    )
    if found.kind == "shipped":
        model = _shipped(cls, found, dtype, device, placement)
    elif found.kind == "hookedattn":
        model = cls.load(found.folder, device=device, dtype=dtype, **placement)
        model.tokenizer = tokenizer or _loading.saved_tokenizer(found.folder)
    elif found.kind == "transformers":
        model = hf.from_hf(
            cls,
            found.folder,
            tokenizer=tokenizer,
            dtype=dtype,
            device=device,
            verify=verify,
            **placement,
        )
    else:
        if tokenizer is None:
            tokenizer = _transformerlens_tokenizer(found, options)
        model = _transformerlens.load(
            cls,
            found.folder,
            found.weights,
            name=found.repo_id or found.name,
            dtype=dtype,
            device=device,
            tokenizer=tokenizer,
            **placement,
        )
    model.source = found
    return model


def _shipped(
    cls: type, found: Resolved, dtype: Any, device: str | None, placement: dict[str, Any]
) -> Any:
    """A shipped model, on one device (it is a few hundred kilobytes)."""
    if any(v is not None for v in placement.values()):
        raise ValueError(
            f"{found.name} is a shipped model of a few hundred kilobytes: it loads on one "
            f"device (device=...), without tp_size or device_map"
        )
    index, value = found.checkpoint
    return _pretrained.load_pretrained(
        cls, found.name, checkpoint_index=index, checkpoint_value=value, device=device, dtype=dtype
    )


def resolve_hf(name: str | os.PathLike, options: HubOptions) -> Resolved:
    """The `transformers` checkpoint called `name` (a folder, a repo id or a
    TransformerLens name), fetched if need be: `folder` is what `from_hf` reads."""
    found = resolve(name, options)
    if found.kind != "transformers":
        raise ValueError(
            f"{found.name} is a {found.kind} checkpoint, not a transformers one: load it "
            f"with HookedTransformer.from_pretrained({found.name!r})"
        )
    return found


def _transformerlens_tokenizer(found: Resolved, options: HubOptions) -> Any:
    """The tokenizer a TL-format config names (a repo of its own), fetched like a model's
    (tokenizer files only, at the repo's default branch)."""
    _, repo = _transformerlens.read_config(found.folder, found.repo_id or found.name)
    if repo is None:
        return None
    local = Path(repo)
    if local.is_dir():
        return _loading.saved_tokenizer(local)
    folder = _fetch.snapshot(
        repo,
        _formats.TOKENIZER_FILES,
        HubOptions(None, options.token, options.cache_dir, options.local_files_only),
    )
    return _loading.saved_tokenizer(folder)
