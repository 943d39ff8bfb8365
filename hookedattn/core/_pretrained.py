"""The shipped models: tiny byte-level transformers trained on the Python standard library.

They live in the package (`hookedattn/pretrained/NAME/`, one `weights_io` directory each,
intermediate checkpoints under `NAME/checkpoints/step-000123/`), so loading needs no
network. `index.json` beside them lists every file with its SHA-256, checked before a
file is read: a corrupted or truncated file is an error that says how to get a good one.

    HookedTransformer.from_pretrained("bytes-attn-only-2l")
    HookedTransformer.from_pretrained("bytes-attn-only-2l", checkpoint_value=300)  # step 300
    list_pretrained()                                                             # what there is

Their names start with `bytes-` so that they cannot be taken for TransformerLens's hub
models of similar names (`attn-only-2l`, `gelu-2l`: other sizes, other data), which
`from_pretrained` loads from the hub (`hookedattn.core.hub`).

`scripts/train.py --preset NAME --ship` rebuilds a model from its recipe
(`hookedattn/training/presets.py`) and rewrites the index.
"""

import dataclasses
import difflib
import hashlib
import json
from pathlib import Path
from typing import Any

from hookedattn.core import _weights_io
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.tokenizers import ByteTokenizer

# A `HookedTransformer`, not imported by name: the model module imports this one.
Model = Any

PRETRAINED_DIR = Path(__file__).resolve().parents[1] / "pretrained"
INDEX_FILE = "index.json"
CHECKPOINTS_DIR = "checkpoints"


@dataclasses.dataclass(frozen=True)
class PretrainedInfo:
    """A shipped model: its config, its checkpoints' steps, and how it was trained.

    `checkpoints` are the steps that can be loaded, the final one last. `training` is the
    summary stored with the weights: the command that reproduces them, steps, tokens,
    seconds, the last evaluation and the corpus (Python version, bytes, digest).
    """

    name: str
    description: str
    config: HookedTransformerConfig
    checkpoints: tuple[int, ...]
    training: dict[str, Any]
    path: Path

    def __repr__(self) -> str:
        cfg = self.config
        kind = "attn-only" if cfg.attn_only else f"d_mlp={cfg.d_mlp}"
        heads = f"{cfg.n_heads} heads, " if cfg.n_layers else ""
        shape = f"{cfg.n_layers}L {kind}, d_model={cfg.d_model}, {heads}n_ctx={cfg.n_ctx}"
        final = self.training.get("final_eval", {})
        loss = f", held-out loss {final['heldout_loss']:.3f}" if final else ""
        plural = "s" if len(self.checkpoints) > 1 else ""
        return f"{self.name}: {shape}, {len(self.checkpoints)} checkpoint{plural}{loss}"


def shipped_names(directory: str | Path = PRETRAINED_DIR) -> tuple[str, ...]:
    """The names of the shipped models (no file but the index is read)."""
    return tuple(sorted(_read_index(directory)))


def list_pretrained(directory: str | Path = PRETRAINED_DIR) -> list[PretrainedInfo]:
    """Every shipped model, by name."""
    return [pretrained_info(name, directory) for name in sorted(_read_index(directory))]


def pretrained_info(name: str, directory: str | Path = PRETRAINED_DIR) -> PretrainedInfo:
    """The `PretrainedInfo` of the shipped model `name` (a `KeyError` naming the others)."""
    entry = _entry(name, directory)
    path = Path(directory) / name
    config, metadata = _weights_io.read_config(path)
    history = metadata.get("history", [])
    training = {
        key: metadata[key]
        for key in (
            "command",
            "step",
            "tokens_seen",
            "train_seconds",
            "cpu_seconds",
            "threads",
            "train_config",
        )
        if key in metadata
    }
    training["final_eval"] = history[-1] if history else {}
    corpus = metadata.get("corpus", {})
    training["corpus"] = {
        k: corpus[k]
        for k in ("python_version", "train_bytes", "heldout_bytes", "sha256")
        if k in corpus
    }
    return PretrainedInfo(
        name=name,
        description=metadata.get("description", ""),
        config=config,
        checkpoints=tuple(_steps(entry)),
        training=training,
        path=path,
    )


def load_pretrained(
    cls: type,
    name: str,
    *,
    checkpoint_index: int | None = None,
    checkpoint_value: int | None = None,
    device: str | None = None,
    dtype: Any = None,
    directory: str | Path = PRETRAINED_DIR,
) -> Model:
    """Load a shipped model (or one of its checkpoints), with its `ByteTokenizer`.

    `checkpoint_value` is a training step, `checkpoint_index` a position in
    `pretrained_info(name).checkpoints` (-1 is the final model), as in TransformerLens.
    """
    entry = _entry(name, directory)
    step = _choose_step(name, entry, checkpoint_index, checkpoint_value)
    path = Path(directory) / name
    files = entry["files"]
    if step != entry["step"]:
        path = path / CHECKPOINTS_DIR / f"step-{step:06d}"
        files = entry["checkpoints"][str(step)]
    for file_name, expected in files.items():
        _verify(path / file_name, expected, entry.get("command", ""))
    model = cls.load(path, device=device, dtype=dtype)
    model.tokenizer = ByteTokenizer()
    return model


def _choose_step(
    name: str, entry: dict, checkpoint_index: int | None, checkpoint_value: int | None
) -> int:
    steps = _steps(entry)
    if checkpoint_index is not None and checkpoint_value is not None:
        raise ValueError("give checkpoint_index or checkpoint_value, not both")
    if checkpoint_value is not None:
        if checkpoint_value not in steps:
            raise ValueError(f"{name} has no checkpoint at step {checkpoint_value}; steps: {steps}")
        return checkpoint_value
    if checkpoint_index is not None:
        if not -len(steps) <= checkpoint_index < len(steps):
            raise ValueError(
                f"checkpoint_index {checkpoint_index} is out of range: {name} has "
                f"{len(steps)} checkpoints (steps {steps})"
            )
        return steps[checkpoint_index]
    return entry["step"]


def _steps(entry: dict) -> list[int]:
    return [*sorted(int(s) for s in entry["checkpoints"]), entry["step"]]


def _verify(path: Path, expected: str, command: str) -> None:
    remedy = f"reinstall hookedattn, or retrain it with `{command} --ship`"
    if not path.is_file():
        raise _weights_io.CheckpointError(f"the shipped file {path} is missing; {remedy}")
    actual = sha256_of(path)
    if actual != expected:
        raise _weights_io.CheckpointError(
            f"the shipped file {path} is corrupted or truncated (sha256 {actual[:12]}..., "
            f"expected {expected[:12]}...); {remedy}"
        )


def sha256_of(path: Path) -> str:
    """The SHA-256 of a file's bytes, as hex."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _read_index(directory: str | Path) -> dict[str, dict]:
    index_path = Path(directory) / INDEX_FILE
    if not index_path.is_file():
        raise FileNotFoundError(
            f"no {INDEX_FILE} in {directory}: the shipped models are missing from this "
            f"installation; train them with `python scripts/train.py --preset NAME --ship`"
        )
    try:
        return json.loads(index_path.read_text())
    except json.JSONDecodeError as error:
        raise _weights_io.CheckpointError(f"{index_path} is corrupted: {error}") from error


def _entry(name: str, directory: str | Path) -> dict:
    index = _read_index(directory)
    if not isinstance(name, str) or name not in index:
        close = difflib.get_close_matches(str(name), list(index), n=2, cutoff=0.5)
        hint = f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""
        raise KeyError(
            f"no shipped model named {name!r}{hint}; shipped: {', '.join(sorted(index))} "
            f"(HookedTransformer.from_pretrained also loads hub repos and TransformerLens's "
            f"names)"
        )
    return index[name]


def write_index(directory: str | Path = PRETRAINED_DIR) -> Path:
    """(Re)write `index.json` for the models in `directory`: files, hashes, steps."""
    directory = Path(directory)
    index = {}
    for model_dir in sorted(
        p for p in directory.iterdir() if (p / _weights_io.CONFIG_FILE).is_file()
    ):
        _, metadata = _weights_io.read_config(model_dir)
        checkpoints = {}
        for ckpt in sorted((model_dir / CHECKPOINTS_DIR).glob("step-*")):
            checkpoints[str(int(ckpt.name[5:]))] = _hashes(ckpt)
        index[model_dir.name] = {
            "step": metadata.get("step", 0),
            "command": metadata.get("command", ""),
            "files": _hashes(model_dir),
            "checkpoints": checkpoints,
        }
    path = directory / INDEX_FILE
    path.write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
    return path


def _hashes(model_dir: Path) -> dict[str, str]:
    return {
        name: sha256_of(model_dir / name)
        for name in (_weights_io.CONFIG_FILE, _weights_io.WEIGHTS_FILE)
    }
