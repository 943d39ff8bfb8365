"""Device maps: whole blocks on devices, the residual stream moved at block boundaries.

    place(model, "auto")                          # every GPU, blocks balanced by bytes
    place(model, ["cuda:0", "cuda:1"])            # these devices, in this order
    place(model, {"blocks.0": "cuda:0", "blocks.1": "cuda:1"})
    place(model, ["cuda:0", "cuda:1"], max_memory={"cuda:0": 20e9, "cuda:1": 40e9})

The units are the embeddings (`embed`, `pos_embed`), each block (`blocks.{i}`) and the
output (`ln_final`, `unembed`). Blocks go to the devices in order, contiguously, so that
the stream crosses each device boundary once per forward; the embeddings and the output
stay on the first device (the model's `cfg.device`), so tokens, logits, the loss and
generation live where they would in one process, at the cost of one more move of the
stream (`[batch pos d_model]`) after the last block (TransformerLens puts the unembedding
on the last device instead). Balanced: the largest device load is as small as contiguous
blocks allow, within each device's `max_memory`.

Nothing in a forward branches on the map: each block and the output norm have a forward
pre-hook (torch's own) that moves their inputs (the stream, the shared masks, a KV cache
entry) to the device of their weights. Cached activations stay on their layer's device
(`run_with_cache(device=...)` gathers them to one).

Only "cpu" exists as a CPU device (torch accepts "cpu:1" and puts the tensor on "cpu"):
a map may name it several times (`["cpu", "cpu"]`), which runs every step of a map with
nothing actually moved; the same tests run with `cuda:0`, `cuda:1` where there are GPUs.
"""

import difflib
import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from hookedattn.core.kernels import AttentionContext
from hookedattn.core.kv_cache import KeyValueCacheEntry, MixerCacheEntry

DeviceMap = str | Sequence[str] | Mapping[str, str]
FIRST_DEVICE_UNITS = (
    "embed", "pos_embed", "ln_embed", "embed_proj", "ln_final", "unembed_transform", "unembed",
)  # fmt: skip


def check_device(device: Any) -> str:
    """`device` as a string, if this machine has it; else a ValueError naming the devices
    it has. The meta device is refused: it holds no values."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ValueError(f"{device!r} is not a device (e.g. 'cpu', 'cuda:0')") from None
    if parsed.type == "meta":
        raise ValueError("the meta device holds no values: a model to run needs real devices")
    if parsed.type == "cpu":
        if parsed.index not in (None, 0):
            raise ValueError(f"device {device!r} does not exist: there is one CPU device, 'cpu'")
        return "cpu"
    if parsed.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        index = 0 if parsed.index is None else parsed.index
        if index >= count:
            have = ", ".join(f"cuda:{i}" for i in range(count)) or "none"
            raise ValueError(
                f"device {device!r} does not exist: this machine has {count} CUDA "
                f"device{'s' if count != 1 else ''} ({have})"
            )
        return f"cuda:{index}"
    try:
        torch.empty(0, device=parsed)
    except (RuntimeError, AssertionError) as error:
        raise ValueError(f"device {device!r} is not available on this machine: {error}") from None
    return str(parsed)


def units(model: Any) -> list[str]:
    """The model's placeable units, in forward order."""
    names = ["embed", *(["pos_embed"] if hasattr(model, "pos_embed") else [])]
    names += ["ln_embed"] if model.cfg.embed_norm else []  # BERT's, BART's
    names += ["embed_proj"] if model.cfg.d_embed is not None else []  # ELECTRA's, RemBERT's
    head = ["unembed_transform"] if model.cfg.unembed_transform is not None else []
    blocks = [f"blocks.{i}" for i in range(model.cfg.n_layers)]
    return [*names, *blocks, "ln_final", *head, "unembed"]


def unit_bytes(model: Any) -> dict[str, int]:
    """Parameter and buffer bytes of each unit (meta tensors count what they would hold)."""
    sizes = {}
    for unit in units(model):
        module = model.get_submodule(unit)
        tensors = [*module.parameters(), *module.buffers()]
        sizes[unit] = sum(t.numel() * t.element_size() for t in tensors)
    return sizes


def infer_device_map(
    model: Any,
    devices: Sequence[str] | None = None,
    max_memory: Mapping[str, float | int] | None = None,
) -> dict[str, str]:
    """Every unit's device: the embeddings and output on the first of `devices`, the blocks
    in order over all of them, contiguously, the largest load as small as it can be while
    each device holds at most `max_memory[device]` bytes (if given).

    `devices` defaults to `max_memory`'s keys, else every CUDA device, else "cpu". A
    device may be named more than once (two slots on one device).
    """
    if devices is None:
        devices = list(max_memory) if max_memory else _all_devices()
    devices = [check_device(d) for d in devices]
    if not devices:
        raise ValueError("a device map needs at least one device, got none")
    capacity = _capacities(devices, max_memory)
    sizes = unit_bytes(model)
    fixed = sum(sizes[u] for u in sizes if not u.startswith("blocks."))
    blocks = [sizes[f"blocks.{i}"] for i in range(model.cfg.n_layers)]
    slots = balanced_slots(blocks, fixed, capacity)
    if slots is None:
        need = fixed + sum(blocks)
        raise ValueError(
            f"the model ({need / 1e9:.3g} GB: {fixed / 1e9:.3g} GB of embeddings and output on "
            f"{devices[0]}, then {len(blocks)} blocks of up to {max(blocks, default=0) / 1e9:.3g} "
            f"GB) does not fit max_memory={dict(max_memory or {})} over {devices}"
        )
    placed = {u: devices[0] for u in sizes if not u.startswith("blocks.")}
    placed |= {f"blocks.{i}": devices[slot] for i, slot in enumerate(slots)}
    return {u: placed[u] for u in units(model)}


def balanced_slots(
    blocks: Sequence[int], fixed: int, capacity: Sequence[float | int]
) -> list[int] | None:
    """Each block's slot (an index into `capacity`): in order, contiguously, the first slot
    starting with `fixed` bytes, no slot over its capacity, and the largest load as small
    as any such placement allows; then, slot by slot, the rest placed by the same rule
    (None where nothing fits)."""
    blocks, capacity = list(blocks), list(capacity)
    if _smallest_feasible_load(blocks, fixed, capacity) is None:
        return None
    slots, i, load = [], 0, fixed
    for slot in range(len(capacity)):
        limit = _smallest_feasible_load(blocks[i:], load, capacity[slot:])
        assert limit is not None  # the whole fits, so what is left fits what is left
        while i < len(blocks) and load + blocks[i] <= min(limit, capacity[slot]):
            slots.append(slot)
            load += blocks[i]
            i += 1
        load = 0
    return slots


def _all_devices() -> list[str]:
    if torch.cuda.is_available() and torch.cuda.device_count():
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return ["cpu"]


def _capacities(devices: list[str], max_memory: Mapping[str, float | int] | None) -> list[float]:
    if not max_memory:
        return [math.inf] * len(devices)
    checked = {check_device(d): _bytes(d, v) for d, v in max_memory.items()}
    unknown = sorted(set(checked) - set(devices))
    if unknown:
        raise ValueError(f"max_memory names {unknown}, which are not among the devices {devices}")
    # A device named twice shares its memory between its slots.
    return [checked.get(d, math.inf) / devices.count(d) for d in devices]


def _bytes(device: str, value: Any) -> float:
    """`max_memory[device]` as bytes: a positive number (NaN compares false with every
    load, so it would let any placement through)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(
            f"max_memory[{device!r}] must be a positive number of bytes, got {value!r}"
        )
    return float(value)


def _fits(blocks: list[int], fixed: int, capacity: list[float | int], limit: float | int) -> bool:
    """Whether the blocks, in order, fill the devices with no load above `limit`."""
    slot, load = 0, fixed
    if fixed > min(limit, capacity[0]):
        return False
    for size in blocks:
        while load + size > min(limit, capacity[slot]):
            slot, load = slot + 1, 0
            if slot == len(capacity):
                return False
        load += size
    return True


def _smallest_feasible_load(
    blocks: list[int], fixed: int, capacity: list[float | int]
) -> int | None:
    """The smallest largest-load of any contiguous placement (a bisection on it), or None."""
    low, high = max([fixed, *blocks]), fixed + sum(blocks)
    if not _fits(blocks, fixed, capacity, high):
        return None
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if _fits(blocks, fixed, capacity, middle) else (middle + 1, high)
    return low


def resolve_device_map(
    model: Any, device_map: DeviceMap, max_memory: Mapping[str, float | int] | None = None
) -> dict[str, str]:
    """Every unit's device from `device_map`: "auto", a list of devices, or a dict of units
    (`"blocks.3"`, `"embed"`, ...) to devices, which must give every block one. Units a dict
    leaves out: the embeddings and the output go with the first block."""
    if isinstance(device_map, str):
        if device_map != "auto":
            raise ValueError(
                f"device_map must be 'auto', a list of devices or a dict of modules to devices, "
                f"got {device_map!r} (for one device, pass device=)"
            )
        return infer_device_map(model, None, max_memory)
    if isinstance(device_map, Mapping):
        placed = _from_dict(model, device_map)
        _check_loads(model, placed, max_memory)
        return placed
    if isinstance(device_map, Sequence):
        return infer_device_map(model, list(device_map), max_memory)
    raise TypeError(f"device_map must be 'auto', a list or a dict, got {type(device_map).__name__}")


def _check_loads(
    model: Any, placed: dict[str, str], max_memory: Mapping[str, float | int] | None
) -> None:
    """Refuse a placement given unit by unit that puts more on a device than its
    `max_memory` allows, naming the device, its load and its units."""
    if not max_memory:
        return
    devices = list(dict.fromkeys(placed.values()))
    capacity = dict(zip(devices, _capacities(devices, max_memory), strict=True))
    sizes = unit_bytes(model)
    for device in devices:
        mine = [u for u, d in placed.items() if d == device]
        load = sum(sizes[u] for u in mine)
        if load > capacity[device]:
            raise ValueError(
                f"device_map puts {load / 1e9:.3g} GB on {device} ({', '.join(mine)}), over "
                f"its max_memory of {capacity[device] / 1e9:.3g} GB"
            )


def _from_dict(model: Any, device_map: Mapping[str, str]) -> dict[str, str]:
    known = units(model)
    for name in device_map:
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise KeyError(
                f"device_map names {name!r}, which is not a placeable part of this model "
                f"(embed, pos_embed, blocks.0..blocks.{model.cfg.n_layers - 1}, ln_final, "
                f"unembed){hint}"
            )
    missing = [u for u in known if u.startswith("blocks.") and u not in device_map]
    if missing:
        raise ValueError(
            f"device_map leaves {', '.join(missing)} unplaced: give every block a device "
            f"(or pass device_map='auto', or a list of devices)"
        )
    placed = {u: check_device(d) for u, d in device_map.items()}
    first = placed.get("embed", placed.get("blocks.0", model.cfg.device))
    for unit in FIRST_DEVICE_UNITS:
        if unit in known:
            placed.setdefault(unit, first)
    return {u: placed[u] for u in known}


def n_devices_map(n_devices: int, device: str | None = None) -> list[str]:
    """TransformerLens's `n_devices`: the first `n_devices` devices of `device`'s type
    ("cuda:0", "cuda:1", ...; on a CPU, "cpu" that many times, the one CPU device)."""
    if not isinstance(n_devices, int) or isinstance(n_devices, bool) or n_devices < 1:
        raise ValueError(f"n_devices must be an int >= 1, got {n_devices!r}")
    kind = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu")).type
    if kind == "cpu":
        return ["cpu"] * n_devices
    return [check_device(f"{kind}:{i}") for i in range(n_devices)]


def device_of_parameter(name: str, placed: Mapping[str, str]) -> str:
    """The device of the unit that parameter `name` belongs to."""
    parts = name.split(".")
    unit = ".".join(parts[:2]) if parts[0] == "blocks" else parts[0]
    return placed[unit]


def place(
    model: Any, device_map: DeviceMap, max_memory: Mapping[str, float | int] | None = None
) -> Any:
    """Put `model`'s units on the devices `device_map` gives (see `resolve_device_map`),
    in place, and make each block's inputs follow: returns the model."""
    placed = resolve_device_map(model, device_map, max_memory)
    for unit, device in placed.items():
        nn.Module.to(model.get_submodule(unit), device)  # the module's own, not the model's
    follow_devices(model, placed)
    return model


def follow_devices(model: Any, placed: Mapping[str, str]) -> None:
    """Record the map (`model.device_map`, `cfg.device` its first device) and give each
    block and the output a pre-hook moving its inputs to its weights' device (once)."""
    if not getattr(model, "_follows_devices", False):
        mover = _ToWeightsDevice()
        for module in (*model.blocks, model.ln_final, model.unembed_transform, model.unembed):
            module.register_forward_pre_hook(mover)
        model._follows_devices = True
    model.device_map = dict(placed)
    model.cfg = model.cfg.replace(device=placed["embed"])


class _ToWeightsDevice:
    """A forward pre-hook: the module's inputs on the device of its weights. The shared
    attention context is moved once per forward and device."""

    def __init__(self) -> None:
        self._moved: dict[torch.device, tuple[AttentionContext, AttentionContext]] = {}

    def __call__(self, module: nn.Module, args: tuple) -> tuple:
        weight = next(module.parameters(), None)
        if weight is None:
            return args
        return tuple(self._move(a, weight.device) for a in args)

    def _move(self, value: Any, device: torch.device) -> Any:
        if isinstance(value, Tensor):
            return value.to(device)
        if isinstance(value, AttentionContext):
            if value.positions.device == device:
                return value
            last = self._moved.get(device)
            if last is None or last[0] is not value:
                pos_embed = None if value.pos_embed is None else value.pos_embed.to(device)
                keys = value.padded_key_positions
                moved = AttentionContext(
                    _MovedMasks(value.blocked, device),
                    value.positions.to(device),
                    value.plain,
                    pos_embed=pos_embed,
                    padded_key_positions=None if keys is None else keys.to(device),
                )
                self._moved[device] = last = (value, moved)
            return last[1]
        frozen = isinstance(value, KeyValueCacheEntry | MixerCacheEntry) and value.frozen
        if frozen and value.device not in (None, device):  # read, never stored into: a copy
            return value.frozen_copy(device)
        # An entry that is stored into is its block's alone: it grows on the block's device.
        return value


class _MovedMasks(dict):
    """A context's masks on another device, each moved when a layer first reads it."""

    def __init__(self, source: Mapping[str, Tensor], device: torch.device) -> None:
        super().__init__()
        self._source, self._device = source, device

    def __missing__(self, kind: str) -> Tensor:
        self[kind] = self._source[kind].to(self._device)
        return self[kind]
