"""From a name to files: the one resolver every entry point uses.

    resolve("bytes-attn-only-2l")            a shipped model (package data, no network)
    resolve("path/to/folder")                a folder: ours, save_pretrained's, or TL's
    resolve("gpt2-small")                    a TransformerLens name or alias -> its repo
    resolve("EleutherAI/pythia-70m", checkpoint_value=1000)   -> revision "step1000"
    resolve("org/name", HubOptions(revision="v1.0", token=...))

A repo is fetched in two steps through `huggingface_hub` (`_fetch`): the small files first
(config, tokenizer, weight index), then only the weights that kind of checkpoint reads
(`_formats`), never the whole repo. Offline (`HF_HUB_OFFLINE=1`, `local_files_only=True`,
or no connection) the same steps read the cache.
"""

import dataclasses
import difflib
import os
from pathlib import Path

from hookedattn.core import _pretrained, hf
from hookedattn.core.hub import _fetch, _formats, _names, _transformerlens
from hookedattn.core.hub._errors import ModelNotFoundError, NotCachedError, NoWeightsError
from hookedattn.core.hub._fetch import HubOptions

KINDS: tuple[str, ...] = ("shipped", *_formats.FORMATS)


@dataclasses.dataclass(frozen=True)
class Resolved:
    """A name turned into files.

    `kind` is one of `KINDS`; `folder` holds the checkpoint (a snapshot in the hub cache
    for a repo; None for a shipped model, which `_pretrained` finds); `repo_id` and
    `revision` say where it came from (None for local files); `weights` is the state-dict
    file of a TransformerLens-format model; `checkpoint` a step asked for (shipped models);
    `commit` the commit the files are of (a hub snapshot's, whatever `revision` named)."""

    name: str
    kind: str
    folder: Path | None = None
    repo_id: str | None = None
    revision: str | None = None
    weights: Path | None = None
    checkpoint: tuple[int | None, int | None] = (None, None)
    commit: str | None = None


def resolve(
    name: str | os.PathLike,
    options: HubOptions | None = None,
    *,
    checkpoint_index: int | None = None,
    checkpoint_value: int | None = None,
) -> Resolved:
    """The files `name` means (see the module docstring), fetched if they are not here."""
    if not isinstance(name, str | os.PathLike):
        raise TypeError(
            f"a model name is a string or a path (a shipped name, a folder, a hub repo id "
            f"or a TransformerLens name), got {type(name).__name__}"
        )
    options = HubOptions() if options is None else options
    checkpoint = (checkpoint_index, checkpoint_value)
    text = os.fspath(name)
    if Path(text).is_dir():
        return _local(Path(text), checkpoint)
    if not isinstance(name, str) or _looks_like_path(text):
        raise FileNotFoundError(
            f"no model directory at {text}: pass a folder holding config.json (written by "
            f"HookedTransformer.save or save_pretrained, a hub snapshot, or a TransformerLens "
            f"toy model), or a name{_other_names(text)}"
        )
    if text in _pretrained.shipped_names():
        return Resolved(text, "shipped", checkpoint=checkpoint)
    return _repo(text, _names.official_name(text) or text, options, checkpoint)


def _repo(
    text: str, repo_id: str, options: HubOptions, checkpoint: tuple[int | None, int | None]
) -> Resolved:
    """The hub repo `repo_id` (what the name `text` means), fetched in two steps: the small
    files, from which its kind is read, then the weights that kind reads."""
    _check_repo_id(text, repo_id)
    options = _checkpoint_revision(repo_id, options, checkpoint)
    folder = _first_files(text, repo_id, options)
    kind = _formats.format_of(folder)
    if kind == "transformerlens":
        weights = _transformerlens_weights(repo_id, folder, options, checkpoint)
        return Resolved(text, kind, folder, repo_id, options.revision, weights, commit=folder.name)
    if any(c is not None for c in checkpoint) and _names.checkpointed_repos(repo_id) is None:
        raise ValueError(
            f"{repo_id} keeps no training checkpoints hookedattn knows of "
            f"(checkpoint_index/checkpoint_value pick Pythia's and Stanford CRFM's "
            f"revisions, and TransformerLens toy models' files); pass revision=... instead"
        )
    if kind == "transformers":
        hf.family_of_folder(folder)  # an architecture we do not import, before the weights
    folder = _fetch.snapshot(repo_id, _formats.weight_names(folder, kind), options)
    if kind == "transformers" and not _has_weights(folder):
        folder = _fetch.snapshot(repo_id, _formats.pickled_names(folder), options)
    if not _has_weights(folder):
        listed = _fetch.repo_files(repo_id, options)
        held = "files not cached here" if listed is None else listed
        raise NoWeightsError(
            f"{repo_id} (revision {options.revision or 'main'!r}) has no weights hookedattn "
            f"reads (model.safetensors, safetensors shards with an index, or "
            f"pytorch_model.bin); it holds {held}"
        )
    return Resolved(text, kind, folder, repo_id, options.revision, commit=folder.name)


def _first_files(text: str, repo_id: str, options: HubOptions) -> Path:
    """The repo's config, tokenizer and weight index; the errors say what else `text`
    might have meant."""
    try:
        return _fetch.snapshot(repo_id, _formats.FIRST_FILES, options)
    except ModelNotFoundError as error:
        raise ModelNotFoundError(f"{error}{_other_names(text)}") from error
    except NotCachedError as error:
        if repo_id == text and "/" not in text:  # perhaps not a repo at all
            raise NotCachedError(
                f"{text!r} is no shipped model and none of TransformerLens's names; as a hub "
                f"repo id: {error}{_other_names(text)}"
            ) from error
        raise


def _local(folder: Path, checkpoint: tuple[int | None, int | None]) -> Resolved:
    kind = _formats.format_of(folder)
    if kind != "transformerlens":
        if any(c is not None for c in checkpoint):
            raise ValueError(
                f"checkpoint_index/checkpoint_value pick a checkpoint of a shipped model, a "
                f"hub repo or a TransformerLens toy model, not of the {kind} folder {folder}"
            )
        return Resolved(str(folder), kind, folder)
    if any(c is not None for c in checkpoint):
        files = [p.relative_to(folder).as_posix() for p in folder.rglob("*.pth")]
        weights = folder / _transformerlens.checkpoint_file(files, str(folder), *checkpoint)
    else:
        weights = _transformerlens.final_file(folder)
    return Resolved(str(folder), kind, folder, weights=weights)


def _check_repo_id(name: str, repo_id: str) -> None:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise ModelNotFoundError(
            f"{name!r} is not a hub repo id ({error}){_other_names(name)}"
        ) from None


def _looks_like_path(name: str) -> bool:
    """A name written as a path (absolute, `./x`, `~/x`, or with more than one `/`): a
    folder that is not there, never a hub repo id."""
    return Path(name).is_absolute() or name.startswith((".", "~")) or name.count("/") > 1


def _other_names(name: str) -> str:
    shipped = ", ".join(_pretrained.shipped_names())
    by_lower = {n.lower(): n for n in _pretrained.shipped_names()}
    close_shipped = difflib.get_close_matches(name.lower(), list(by_lower), n=1, cutoff=0.75)
    close = [by_lower[n] for n in close_shipped] + _names.close_names(name)
    hint = f" Did you mean {' or '.join(map(repr, close))}?" if close else ""
    return (
        f".{hint} A model name is a shipped model ({shipped}), a local folder, a hub repo "
        f"id (ORG/NAME) or one of TransformerLens's names (hookedattn.core.hub.tl_model_names())"
    )


def _checkpoint_revision(
    repo_id: str, options: HubOptions, checkpoint: tuple[int | None, int | None]
) -> HubOptions:
    """The options with the revision a Pythia or Stanford CRFM checkpoint means."""
    repos = _names.checkpointed_repos(repo_id)
    if repos is None or all(c is None for c in checkpoint):
        return options
    if options.revision is not None:
        raise ValueError(
            f"give revision={options.revision!r} or a checkpoint (checkpoint_index / "
            f"checkpoint_value), not both: {repo_id}'s checkpoints are its revisions"
        )
    step = _names.checkpoint_step(repos.steps, repo_id, *checkpoint)
    return dataclasses.replace(options, revision=repos.revision.format(step=step))


def _transformerlens_weights(
    repo_id: str, folder: Path, options: HubOptions, checkpoint: tuple[int | None, int | None]
) -> Path:
    if all(c is None for c in checkpoint):
        folder = _fetch.snapshot(repo_id, [_transformerlens.FINAL_PATTERN], options)
        return _transformerlens.final_file(folder)
    files = _fetch.repo_files(repo_id, options)
    if files is None:  # offline: the checkpoints this cache holds
        files = [p.relative_to(folder).as_posix() for p in folder.rglob("*.pth")]
    file = _transformerlens.checkpoint_file(files, repo_id, *checkpoint)
    return _fetch.snapshot(repo_id, [file], options) / file


def _has_weights(folder: Path) -> bool:
    return any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))
