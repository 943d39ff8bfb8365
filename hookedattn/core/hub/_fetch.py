"""Files from the Hugging Face hub, through `huggingface_hub` and its cache.

Everything that touches the hub is `huggingface_hub`'s: its cache layout
(`models--ORG--NAME/snapshots/COMMIT/`) and locks, resumable downloads, revisions, tokens
(`token=`, `HF_TOKEN`, `hf auth login`), `HF_HOME` / `HF_HUB_CACHE` / `HF_HUB_OFFLINE`, and
its progress bars. This module only chooses what to fetch (the files an import reads, never
a whole repo: `snapshot` takes their names or patterns) and turns the client's errors into
ones that name the repo, the revision, the cache folder and the fix (`_errors`).
"""

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hookedattn.core.hub._errors import (
    DownloadInterruptedError,
    GatedModelError,
    ModelNotFoundError,
    NotCachedError,
    RevisionNotFoundError,
)


@dataclasses.dataclass(frozen=True)
class HubOptions:
    """Where and as whom to fetch: `revision` (a branch, tag or commit; None is the default
    branch), `token` (None: the stored one, `HF_TOKEN` or none; False: none), `cache_dir`
    (None: `HF_HUB_CACHE`) and `local_files_only` (the cache only, as `HF_HUB_OFFLINE=1`)."""

    revision: str | None = None
    token: str | bool | None = None
    cache_dir: str | Path | None = None
    local_files_only: bool = False

    def __post_init__(self) -> None:
        if self.revision is not None and not (isinstance(self.revision, str) and self.revision):
            raise ValueError(
                f"revision must be a branch, tag or commit name, got {self.revision!r}"
            )
        if not isinstance(self.local_files_only, bool):
            raise TypeError(
                f"local_files_only must be True or False, got {self.local_files_only!r}"
            )


def hub_module() -> Any:
    """`huggingface_hub`, or an ImportError that says how to install it."""
    try:
        import huggingface_hub
    except ImportError as error:
        raise ImportError(
            "loading a model by its hub name needs `huggingface_hub`: pip install 'hookedattn[hf]'"
        ) from error
    return huggingface_hub


def snapshot(repo_id: str, patterns: Sequence[str], options: HubOptions) -> Path:
    """The cached snapshot folder of `repo_id` at `options.revision`, holding the files
    that match `patterns` (names or `fnmatch` patterns) which the repo has, downloaded if
    they are not cached yet. Offline (or with the hub unreachable), the cache alone."""
    hub = hub_module()
    try:
        folder = hub.snapshot_download(
            repo_id,
            revision=options.revision,
            allow_patterns=list(patterns),
            token=options.token,
            cache_dir=options.cache_dir,
            local_files_only=options.local_files_only,
        )
    except Exception as error:
        raise translate(error, repo_id, options) from error
    return Path(folder)


def repo_files(repo_id: str, options: HubOptions) -> list[str] | None:
    """Every file path in the repo at the revision, or None offline (where the hub cannot
    be asked)."""
    hub = hub_module()
    if options.local_files_only or hub.constants.HF_HUB_OFFLINE:
        return None
    try:
        return hub.HfApi().list_repo_files(repo_id, revision=options.revision, token=options.token)
    except Exception as error:
        translated = translate(error, repo_id, options)
        if isinstance(translated, NotCachedError | DownloadInterruptedError):
            return None  # unreachable: what the cache holds is all there is
        raise translated from error


def cache_folder(options: HubOptions) -> Path:
    """The hub cache this load reads and fills."""
    if options.cache_dir is not None:
        return Path(options.cache_dir).expanduser()
    return Path(hub_module().constants.HF_HUB_CACHE)


def translate(error: Exception, repo_id: str, options: HubOptions) -> Exception:
    """Our account of a `huggingface_hub` error (the error itself if it is none of those)."""
    hub = hub_module()
    errors = hub.errors
    revision = options.revision or "main"
    endpoint = hub.constants.ENDPOINT
    if isinstance(error, errors.GatedRepoError):
        return GatedModelError(
            f"{repo_id} is gated: accept its licence at {endpoint}/{repo_id} (logged in "
            f"there), then give this machine your token: `hf auth login`, the HF_TOKEN "
            f"variable, or token=... ({_token_state(options)})"
        )
    if isinstance(error, errors.RevisionNotFoundError):
        return RevisionNotFoundError(
            f"{repo_id} has no revision {revision!r}: give a branch, a tag or a commit "
            f"of it (listed at {endpoint}/{repo_id}/tree/main)"
        )
    if isinstance(error, errors.RepositoryNotFoundError):
        return ModelNotFoundError(
            f"no repo {repo_id!r} on {endpoint} (or it is private, and no token that may "
            f"see it was sent: {_token_state(options)}); check the name, or pass a local "
            f"folder"
        )
    if isinstance(error, errors.HfHubHTTPError) and _status(error) in (401, 403):
        return GatedModelError(
            f"{endpoint} refused {repo_id} (HTTP {_status(error)}): the repo is private or "
            f"gated, or the token is not allowed to read it ({_token_state(options)})"
        )
    if isinstance(error, errors.LocalEntryNotFoundError | errors.OfflineModeIsEnabled):
        return NotCachedError(_not_cached(repo_id, revision, options, error))
    if _is_transport_error(error):
        return DownloadInterruptedError(
            f"the download of {repo_id} (revision {revision!r}) stopped part way, after "
            f"huggingface_hub's own retries ({type(error).__name__}: {error}); run the same "
            f"load again: the files that arrived whole are in the cache "
            f"{cache_folder(options)} and only the rest is fetched"
        )
    if isinstance(error, errors.HFValidationError):
        return ModelNotFoundError(f"{repo_id!r} is not a hub repo id: {error}")
    return error


def _not_cached(repo_id: str, revision: str, options: HubOptions, error: Exception) -> str:
    hub = hub_module()
    if options.local_files_only:
        why, online = "local_files_only=True", "leave local_files_only False"
    elif hub.constants.HF_HUB_OFFLINE:
        why, online = "HF_HUB_OFFLINE=1", "unset HF_HUB_OFFLINE"
    else:
        endpoint = hub.constants.ENDPOINT
        why, online = f"{endpoint} cannot be reached", f"check the connection to {endpoint}"
    return (
        f"{repo_id} at revision {revision!r} is not in the hub cache {cache_folder(options)} "
        f"(or only part of it is), and {why}. To download it, {online}. On a machine "
        f"without network, fill the cache elsewhere (the same load, or `hf download "
        f"{repo_id}`), copy it here and point HF_HUB_CACHE (or HF_HOME) at it, with "
        f"HF_HUB_OFFLINE=1. ({type(error).__name__}: {str(error).splitlines()[0][:160]})"
    )


def _token_state(options: HubOptions) -> str:
    if options.token is False:
        return "token=False sent none"
    if isinstance(options.token, str):
        return "the token passed was sent"
    token = hub_module().get_token()
    return "a stored token was sent" if token else "no token is stored"


def _status(error: Exception) -> int | None:
    response = getattr(error, "response", None)
    return getattr(response, "status_code", None)


def _is_transport_error(error: Exception) -> bool:
    # huggingface_hub's HTTP client (httpx2) raises these when a connection breaks.
    return any(
        cls.__name__ in ("TransportError", "RemoteProtocolError", "ReadError")
        and cls.__module__.split(".")[0].startswith("httpx")
        for cls in type(error).__mro__
    ) or isinstance(error, ConnectionError)
