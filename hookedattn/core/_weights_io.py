"""Saving and loading models: safetensors weights plus a JSON config, never pickle.

A checkpoint is a directory holding `config.json` and `model.safetensors`. Loading checks
that every tensor the config implies is present with the right shape and that nothing else
is, and names what is wrong when it is not.

A file is not trusted to be sensible. Before anything is built, the config is checked
against the weights file's header (names, shapes and dtypes, read without reading or
allocating a tensor): every size that decides how much memory the model takes (`n_layers`,
`d_model`, `d_vocab`, `n_ctx`, `n_heads`, `d_head`, `d_mlp`, `d_vocab_out`) must be the
one the weights have, so a 200-byte config cannot ask for a terabyte. Weights must be
floating point; a float width other than the config's is converted only when the caller
asks for a dtype.
"""

import json
import math
import re
from pathlib import Path
from typing import Any, NamedTuple

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from hookedattn.core import parallel
from hookedattn.core.config import HookedTransformerConfig

# A `HookedTransformer`, not imported by name: the model module imports this one.
Model = Any

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
# A config is a few kB; anything much larger is not one (and is not read into memory).
MAX_CONFIG_BYTES = 1 << 24
# The safetensors library's own limit on a header.
MAX_HEADER_BYTES = 100 << 20
# What a config may make us allocate beyond the weights it is checked against: buffers
# sized by a field no weight fixes (the n_ctx x n_ctx attention mask of a model with no
# learned positions) may take as much as the weights file, or this, whichever is more.
MAX_UNPINNED_BYTES = 1 << 30

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U64": torch.uint64,
    "U32": torch.uint32,
    "U16": torch.uint16,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "C64": torch.complex64,
    "C128": torch.complex128,
}


class CheckpointError(ValueError):
    """A checkpoint that is missing, truncated, or does not match its config."""


class TensorHeader(NamedTuple):
    """One tensor as a safetensors header describes it: `shape, dtype = header[name]`."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def read_safetensors_header(path: str | Path) -> dict[str, TensorHeader]:
    """The names, shapes and dtypes of the tensors in a safetensors file, from its header.

    Reads the header only (at most `MAX_HEADER_BYTES`); no tensor is read or allocated.
    A header that is cut short, not JSON, or whose entries do not fit the file (a shape
    whose bytes are not its data's, data past the end) is a `CheckpointError`.
    """
    path = Path(path)
    size = path.stat().st_size
    with path.open("rb") as file:
        prefix = file.read(8)
        n_header = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if not 0 < n_header <= min(MAX_HEADER_BYTES, size - 8):
            raise CheckpointError(
                f"{path} is not a safetensors file, or is truncated: its header length "
                f"{n_header} does not fit a file of {size} bytes"
            )
        raw = file.read(n_header)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise CheckpointError(f"{path} has a corrupted header: {error}") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path} has a corrupted header: not a JSON object")
    n_data = size - 8 - n_header
    return {
        name: _tensor_header(path, name, entry, n_data)
        for name, entry in header.items()
        if name != "__metadata__"
    }


def _tensor_header(path: Path, name: str, entry: Any, n_data: int) -> TensorHeader:
    """One header entry, checked: a known dtype, a shape, and data inside the file."""
    problem = None
    if not isinstance(entry, dict) or entry.get("dtype") not in SAFETENSORS_DTYPES:
        problem = f"dtype {entry.get('dtype') if isinstance(entry, dict) else entry!r}"
    else:
        shape, offsets = entry.get("shape"), entry.get("data_offsets")
        if not _ints(shape) or not (_ints(offsets) and len(offsets) == 2):
            problem = f"shape {shape!r} and data_offsets {offsets!r}"
        else:
            dtype = SAFETENSORS_DTYPES[entry["dtype"]]
            n_bytes = math.prod(shape) * dtype.itemsize
            begin, end = offsets
            if not (0 <= begin <= end <= n_data and end - begin == n_bytes):
                problem = f"{n_bytes} bytes of data at {offsets} (the file has {n_data})"
    if problem is not None:
        raise CheckpointError(f"{path} is truncated or corrupted: tensor {name!r} has {problem}")
    return TensorHeader(tuple(shape), dtype)


def _ints(values: Any) -> bool:
    return isinstance(values, list) and all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values
    )


def save(model: Model, path: str | Path, metadata: dict[str, Any] | None = None) -> Path:
    """Write `config.json` (plus optional `metadata`) and `model.safetensors` into `path`.

    A tensor-parallel model is saved whole: every rank must call this; the sharded
    parameters are gathered, rank 0 writes, and every rank returns once the files are
    complete.
    """
    if not isinstance(model, parallel.TensorParallelModel):
        return save_state(model.cfg, model.state_dict(), path, metadata)
    tensors = parallel.full_state_dict(model)
    if model.tp.rank == 0:
        save_state(model.cfg, tensors, path, metadata)
    model.tp.barrier()
    return Path(path)


def save_state(
    config: HookedTransformerConfig,
    tensors: dict[str, torch.Tensor],
    path: str | Path,
    metadata: dict[str, Any] | None = None,
) -> Path:
    """Write a checkpoint of `config` and the state dict `tensors` into `path`."""
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    saved = {"config": config.to_dict(), **({"metadata": metadata} if metadata else {})}
    (path / CONFIG_FILE).write_text(json.dumps(saved, indent=2, sort_keys=True) + "\n")
    tensors = {name: t.detach().contiguous().cpu() for name, t in tensors.items()}
    save_file(tensors, str(path / WEIGHTS_FILE))
    return path


def read_config(path: str | Path) -> tuple[HookedTransformerConfig, dict[str, Any]]:
    """The config and metadata stored in a checkpoint directory.

    Every problem with the file is a `CheckpointError`: not JSON, nested too deeply, too
    large to be a config, or a field the config refuses (the message names the field, its
    value and what is allowed).
    """
    path = Path(path)
    config_path = path / CONFIG_FILE
    if not config_path.is_file():
        raise CheckpointError(f"no {CONFIG_FILE} in {path}: not a hookedattn checkpoint")
    size = config_path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise CheckpointError(
            f"{config_path} is {size} bytes, too large to be a config (at most "
            f"{MAX_CONFIG_BYTES}); not a hookedattn checkpoint"
        )
    try:
        data = json.loads(config_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointError(f"{config_path} is not a valid config (not JSON): {error}") from error
    except RecursionError:
        raise CheckpointError(f"{config_path} is nested too deeply to be a config") from None
    if not isinstance(data, dict) or not isinstance(data.get("config"), dict):
        raise CheckpointError(
            f"{config_path} is not a hookedattn config: expected an object with a "
            f'"config" object in it'
        )
    try:
        config = HookedTransformerConfig.from_dict(data["config"])
    except (TypeError, ValueError, OverflowError, RecursionError) as error:
        raise CheckpointError(f"{config_path} is not a valid config: {error}") from error
    metadata = data.get("metadata", {})
    return config, metadata if isinstance(metadata, dict) else {}


def load(
    cls: type,
    path: str | Path,
    device: str | None = None,
    dtype: torch.dtype | str | None = None,
    tp_size: int | None = None,
    device_map: Any = None,
    max_memory: Any = None,
) -> Model:
    """Build a model from a checkpoint directory, checking every tensor against the config.

    The config is checked against the weights file's header before anything is built or
    read (see the module docstring). `device` overrides the config's (a device this
    machine lacks is an error that says so); `dtype` converts the weights to that dtype,
    which is otherwise the config's, and which every tensor in the file must then have.
    The model is built on the meta device and each tensor read memory-mapped, a chunk at a
    time, into the tensor it keeps; `tp_size` and `device_map` split or place it as
    `HookedTransformer.from_hf` does, each rank or device reading only its part.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no checkpoint at {path}")
    config, _ = read_config(path)
    weights_path = path / WEIGHTS_FILE
    if not weights_path.is_file():
        raise CheckpointError(f"no {WEIGHTS_FILE} in {path}")
    header = read_safetensors_header(weights_path)
    check_header(
        header,
        config,
        str(weights_path),
        convert=dtype is not None,
        config_source=str(path / CONFIG_FILE),
    )
    changes = {"device": device, "dtype": dtype}
    if any(v is not None for v in changes.values()):
        config = config.replace(**{k: v for k, v in changes.items() if v is not None})
    if tp_size is not None:  # `True == 1`: checked before any comparison with 1
        tp_size = parallel.check_tp_size(config, tp_size)
    if device_map is None and tp_size in (None, 1):
        _check_device(config.device, from_file=device is None, path=path)
    source = str(weights_path)
    return parallel.build_model(
        cls,
        config,
        lambda name, part, where: _read_tensor(weights_path, header, name, part, config, where),
        check=lambda model: check_state_dict(model, header, source),
        tp_size=tp_size,
        device_map=device_map,
        max_memory=max_memory,
    )


# A chunk of this many bytes is read at a time: the finished model plus one chunk resident.
CHUNK_BYTES = 4 << 20


def _read_tensor(
    path: Path,
    header: dict[str, TensorHeader],
    name: str,
    part: Any,
    config: HookedTransformerConfig,
    device: str,
) -> torch.Tensor:
    """The tensor `name` of the file (cut to `part`, a `LocalSlice`, if given) in the
    config's dtype on `device`: mapped and copied a chunk of its first axis at a time."""
    index = [slice(None)] * len(header[name].shape)
    if part is not None:
        index[part.axis] = slice(part.start, part.stop)
    shape = [len(range(*s.indices(n))) for s, n in zip(index, header[name].shape, strict=True)]
    out = torch.empty(shape, dtype=config.dtype, device=device)
    rows = shape[0] if shape else 1
    row_bytes = max(1, out.nbytes // max(1, rows))
    step = max(1, CHUNK_BYTES // row_bytes)
    first = index[0].indices(header[name].shape[0])[0] if shape else 0
    try:
        for start in range(0, rows, step):
            stop = min(start + step, rows)
            if shape:
                index[0] = slice(first + start, first + stop)
            with safe_open(str(path), framework="pt", device="cpu") as handle:
                chunk = handle.get_slice(name)[tuple(index)]
            (out.narrow(0, start, stop - start) if shape else out).copy_(chunk)
            del chunk  # and with it the mapping of its pages
    except (SafetensorError, OSError, RuntimeError) as error:
        raise CheckpointError(
            f"{path} cannot be read (truncated or corrupted?): {error}"
        ) from error
    return out


def _check_device(device: str, from_file: bool, path: Path) -> None:
    """A device this machine lacks is named as such, not taken for a corrupted file."""
    try:
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError, ValueError) as error:
        where = f"the config in {path} asks for it" if from_file else "it was asked for"
        raise CheckpointError(
            f"device {device!r} is not available on this machine ({where}): {error}. "
            f"Pass device='cpu' (or another device this machine has) to load it here"
        ) from None


_BLOCK = re.compile(r"blocks\.(\d+)\.")

# The tensors whose shapes fix the sizes a config could otherwise choose freely:
# (config field, tensor, axis, whether the config needs the tensor at all).
_PINS: tuple[tuple[str, str, int, Any], ...] = (
    ("d_vocab", "embed.W_E", 0, lambda cfg: True),
    ("d_model", "embed.W_E", 1, lambda cfg: cfg.d_embed is None),
    # Embeddings of another width than the stream's, and their projection into it.
    ("d_embed", "embed.W_E", 1, lambda cfg: cfg.d_embed is not None),
    ("d_model", "embed_proj.W_proj", 1, lambda cfg: cfg.d_embed is not None),
    ("d_unembed", "unembed.W_U", 0, lambda cfg: cfg.d_unembed is not None),
    ("d_vocab_out", "unembed.W_U", 1, lambda cfg: True),
    ("n_ctx", "pos_embed.W_pos", 0, lambda cfg: cfg.has_learned_positions),
    ("n_heads", "blocks.{attn}.attn.W_Q", 0, lambda cfg: _attends(cfg)),
    ("d_head", "blocks.{attn}.attn.W_Q", 2, lambda cfg: _attends(cfg)),
    ("d_mlp", "blocks.{mlp}.mlp.W_in", 1, lambda cfg: _dense_mlp(cfg)),
    # Differential attention's W_O reads pairs of heads, 2 d_head wide (d_value is d_head).
    ("d_value", "blocks.{attn}.attn.W_O", 1,
     lambda cfg: _attends(cfg) and not cfg.differential_attention),
    ("kv_lora_rank", "blocks.{attn}.attn.W_KV_a", 1,
     lambda cfg: cfg.n_layers > 0 and cfg.is_latent_attention),
    ("q_lora_rank", "blocks.{attn}.attn.W_Q_a", 1,
     lambda cfg: cfg.n_layers > 0 and cfg.q_lora_rank is not None),
    # A mixture of experts stacks its experts' weights: `W_in: [expert d_model d_mlp]`; some
    # blocks may keep dense MLPs (`{moe}`: the first block with experts, `{dense}` without).
    ("num_experts", "blocks.{moe}.mlp.W_in", 0, lambda cfg: _moe(cfg)),
    ("d_mlp", "blocks.{moe}.mlp.W_in", 2, lambda cfg: _moe(cfg)),
    ("d_mlp_shared", "blocks.{moe}.mlp.shared_expert.W_in", 1,
     lambda cfg: _moe(cfg) and cfg.d_mlp_shared is not None),
    ("d_mlp_dense", "blocks.{dense}.mlp.W_in", 1,
     lambda cfg: _moe(cfg) and not all(map(cfg.layer_is_moe, range(cfg.n_layers)))),
)  # fmt: skip


def _first_attention(cfg: HookedTransformerConfig) -> int:
    """The first block that attends (`{attn}`; a hybrid's first blocks may not)."""
    return next((i for i in range(cfg.n_layers) if cfg.layer_mixer(i) == "attention"), 0)


def _first_mlp(cfg: HookedTransformerConfig) -> int:
    """The first block with an MLP (`{mlp}`; a Nemotron-H's first blocks may have none)."""
    return next((i for i in range(cfg.n_layers) if cfg.layer_has_mlp(i)), 0)


def _attends(cfg: HookedTransformerConfig) -> bool:
    return cfg.n_layers > 0 and cfg.layer_mixer(_first_attention(cfg)) == "attention"


def _dense_mlp(cfg: HookedTransformerConfig) -> bool:
    return cfg.n_layers > 0 and not cfg.attn_only and not cfg.is_moe


def _moe(cfg: HookedTransformerConfig) -> bool:
    return any(map(cfg.layer_is_moe, range(cfg.n_layers)))


def _first_moe(cfg: HookedTransformerConfig, moe: bool = True) -> int:
    """The first block whose MLP is (`moe`) or is not a mixture of experts; 0 if none."""
    return next((i for i in range(cfg.n_layers) if cfg.layer_is_moe(i) == moe), 0)


def check_header(
    header: dict[str, TensorHeader],
    config: HookedTransformerConfig,
    source: str = "the weights file",
    convert: bool = False,
    config_source: str = "the config",
) -> None:
    """Check a config against a weights file's header, before anything is allocated.

    Weights must be floating point, of the config's dtype unless `convert`; the number of
    blocks and every size the weights fix must be the config's; a size no weight fixes
    (the context length of a model without learned positions) may not ask for more than
    the file's size or `MAX_UNPINNED_BYTES` of buffers. A `CheckpointError` names the
    field, the config's value (from `config_source`) and the file's.
    """
    _check_dtypes(header, config, source, convert)
    blocks = sorted({int(m.group(1)) for name in header if (m := _BLOCK.match(name))})
    if blocks != list(range(config.n_layers)):
        held = f"blocks {blocks[0]}..{blocks[-1]}" if blocks else "no blocks"
        raise CheckpointError(
            f"n_layers={config.n_layers} in {config_source} does not match {source}, which holds "
            f"{held} ({len(blocks)} layers)"
        )
    problems = []
    for field, name, axis, needed in _PINS:
        value = getattr(config, field)
        name = name.format(moe=_first_moe(config), dense=_first_moe(config, moe=False),
                           attn=_first_attention(config), mlp=_first_mlp(config))  # fmt: skip
        if not needed(config):
            continue
        if name not in header or len(header[name].shape) <= axis:
            problems.append(f"{field}={value}: no {name} of rank > {axis} to fix it")
        elif header[name].shape[axis] != value:
            shape = list(header[name].shape)
            problems.append(f"{field}={value}, but {name} is {shape} ({field} {shape[axis]})")
    if problems:
        raise CheckpointError(
            f"{config_source} does not match {source}, nothing was built: {'; '.join(problems)}"
        )
    if not config.has_learned_positions:
        n_bytes = sum(math.prod(h.shape) * h.dtype.itemsize for h in header.values())
        limit = max(n_bytes, MAX_UNPINNED_BYTES)
        if config.n_ctx**2 > limit:
            raise CheckpointError(
                f"n_ctx={config.n_ctx} in {config_source} is fixed by no weight in {source} (a "
                f"{config.positional_embedding_type!r} positional scheme has none), and "
                f"its n_ctx x n_ctx attention mask would take {config.n_ctx**2:.3g} bytes, "
                f"more than the {limit:.3g} allowed; at most n_ctx={math.isqrt(limit)}"
            )


def _check_dtypes(
    header: dict[str, TensorHeader], config: HookedTransformerConfig, source: str, convert: bool
) -> None:
    not_float = [f"{n} ({h.dtype})" for n, h in header.items() if not h.dtype.is_floating_point]
    if not_float:
        raise CheckpointError(
            f"{source} holds weights that are not floating point: {', '.join(not_float[:4])}"
            f"{' ...' if len(not_float) > 4 else ''}; weights are float32, float64, "
            f"bfloat16 or float16"
        )
    other = [f"{n} ({h.dtype})" for n, h in header.items() if h.dtype != config.dtype]
    if other and not convert:
        raise CheckpointError(
            f"{source} holds weights whose dtype is not the config's {config.dtype}: "
            f"{', '.join(other[:4])}{' ...' if len(other) > 4 else ''}; ask for a dtype "
            f"to convert them (load(path, dtype=...))"
        )


def load_checked_state_dict(
    model: torch.nn.Module, tensors: dict[str, torch.Tensor], source: str = "state dict"
) -> None:
    """Copy `tensors` into `model`, first checking names, shapes and kinds of dtype; nothing
    is half-loaded.

    A tensor must be floating point where the model's is (its width is converted: the
    caller chose the model's dtype); bool, integer or complex weights are refused.
    """
    got = {name: TensorHeader(tuple(t.shape), t.dtype) for name, t in tensors.items()}
    check_state_dict(model, got, source)
    expected = model.state_dict()
    with torch.no_grad():
        for name, param in expected.items():
            param.copy_(tensors[name].to(param.dtype))


def check_state_dict(
    model: torch.nn.Module, got: dict[str, TensorHeader], source: str = "state dict"
) -> None:
    """A `CheckpointError` listing every tensor of `got` (names to shapes and dtypes, as a
    header gives them) missing from the model, unexpected, misshapen or of the wrong kind
    of dtype for it."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(got))
    extra = sorted(set(got) - set(expected))
    wrong = [
        f"{name}: {tuple(got[name].shape)} instead of {tuple(t.shape)}"
        for name, t in expected.items()
        if name in got and tuple(got[name].shape) != tuple(t.shape)
    ]
    kinds = [
        f"{name}: {got[name].dtype} instead of {t.dtype}"
        for name, t in expected.items()
        if name in got and not _same_kind(got[name].dtype, t.dtype)
    ]
    problems = []
    if missing:
        problems.append(f"missing {missing}")
    if extra:
        problems.append(f"unexpected {extra}")
    if wrong:
        problems.append(f"wrong shapes {wrong}")
    if kinds:
        problems.append(f"wrong dtypes {kinds}")
    if problems:
        raise CheckpointError(f"{source} does not match the config: " + "; ".join(problems))


def _same_kind(got: torch.dtype, want: torch.dtype) -> bool:
    """Whether a tensor of dtype `got` may be copied into one of `want` without losing its
    meaning: float into float (any width), otherwise only the same dtype."""
    if want.is_floating_point:
        return got.is_floating_point
    return got == want
