"""What loading by name shares: the hub options from the keywords, `fnmatch` patterns that
name one file each, the files a snapshot must hold, and the device and dtype a loaded
module is moved to."""

from collections.abc import Sequence
from pathlib import Path, PurePosixPath
from typing import Any

import torch

from hookedattn.core.hub import HubOptions, NotCachedError, NoWeightsError
from hookedattn.sae.config import DTYPES


def literal(path: str) -> str:
    """`path` as an `fnmatch` pattern that matches it only (`*`, `?`, `[` bracketed)."""
    return "".join(f"[{c}]" if c in "*?[" else c for c in path)


def in_repo(repo_id: str, folder: str, name: str) -> str:
    """The path of file `name` in `folder` of `repo_id` (`""`: the repo's top), refused if
    it could leave the snapshot."""
    if folder.startswith("/") or ".." in PurePosixPath(folder).parts or "\\" in folder:
        raise ValueError(
            f"{folder!r} is not a folder inside the repo {repo_id} (a relative path without '..')"
        )
    return f"{folder.strip('/')}/{name}" if folder.strip("/") else name


def require(
    folder: Path, files: Sequence[str], repo_id: str, options: HubOptions, what: str
) -> None:
    """Each of `files` (paths in the repo) is in the snapshot `folder`, or an error that
    says whether the cache lacks them (offline) or the repo does."""
    missing = [f for f in files if not (folder / f).is_file()]
    if not missing:
        return
    revision = options.revision or "main"
    import huggingface_hub

    if options.local_files_only or huggingface_hub.constants.HF_HUB_OFFLINE:
        why = "local_files_only=True" if options.local_files_only else "HF_HUB_OFFLINE=1"
        raise NotCachedError(
            f"{what}: {', '.join(missing)} of {repo_id} (revision {revision!r}) are not in the "
            f"hub cache {folder.parent.parent}, and {why}: load it once online to fill the "
            f"cache (or copy a filled cache here and point HF_HUB_CACHE at it)"
        )
    raise NoWeightsError(
        f"{what}: {repo_id} (revision {revision!r}) has no {', '.join(missing)}; the release "
        f"registry may name a folder this revision lacks: check the repo's files at "
        f"{huggingface_hub.constants.ENDPOINT}/{repo_id}/tree/{revision}, or pass revision="
    )


def torch_dtype(dtype: Any) -> torch.dtype | None:
    """`dtype` (None, a name such as `"float32"`, or a `torch.dtype`) as a `torch.dtype`."""
    if dtype is None or dtype in DTYPES.values():
        return dtype
    if isinstance(dtype, str) and dtype.removeprefix("torch.") in DTYPES:
        return DTYPES[dtype.removeprefix("torch.")]
    raise ValueError(f"dtype must be one of {tuple(DTYPES)} (or the torch dtype), got {dtype!r}")


def place(module: torch.nn.Module, device: Any, dtype: Any) -> torch.nn.Module:
    """`module` moved to `device` and converted to `dtype` (each None: as loaded)."""
    target = {"device": device, "dtype": torch_dtype(dtype)}
    target = {k: v for k, v in target.items() if v is not None}
    return module.to(**target) if target else module


def options(revision: Any, token: Any, cache_dir: Any, local_files_only: Any) -> HubOptions:
    """The hub options the keywords give (checked by `HubOptions`)."""
    return HubOptions(revision, token, cache_dir, local_files_only)
