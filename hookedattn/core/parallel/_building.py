"""Building a model from a checkpoint without ever holding more than its weights: built on
the meta device, split or placed, then each parameter read (only this rank's slice, on its
own device) and assigned.

    model = build_model(cls, cfg, read, tp_size=2)          # inside a torchrun job
    model = build_model(cls, cfg, read, device_map="auto")

`read(name, local_slice, device)` returns the parameter `name` (of the one-process state
dict), cut to `local_slice` when it is sharded (None: whole), on `device`: the HF importer
reads it through its family's table, `HookedTransformer.load` from our own file; both read
memory-mapped, in chunks, only the bytes asked for.
"""

from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.parallel._device_map import (
    DeviceMap,
    device_of_parameter,
    follow_devices,
    resolve_device_map,
)
from hookedattn.core.parallel._group import rank_device, tensor_parallel_group
from hookedattn.core.parallel._sharding import parameter_slices
from hookedattn.core.parallel._shards import LocalSlice, check_tp_size

Read = Callable[[str, LocalSlice | None, str], Tensor]


def build_model(
    cls: type,
    cfg: HookedTransformerConfig,
    read: Read,
    *,
    tokenizer: Any = None,
    check: Callable[[Any], None] | None = None,
    tp_size: int | None = None,
    device_map: DeviceMap | None = None,
    max_memory: Mapping[str, float | int] | None = None,
) -> Any:
    """A `cls` of `cfg` with the parameters `read` gives (module docstring). `check(model)`
    runs on the meta model, before anything is read (names and shapes against a file)."""
    if tp_size is not None:  # `True == 1`: checked before any comparison with 1
        tp_size = check_tp_size(cfg, tp_size)
    if tp_size not in (None, 1) and device_map is not None:
        raise ValueError(
            "tp_size and device_map are alternatives: tensor parallelism splits every layer "
            "over the ranks of a torchrun job, a device map places whole layers on devices"
        )
    model = cls(cfg.replace(device="meta", init_weights=False), tokenizer=tokenizer)
    if check is not None:
        check(model)
    placed = None
    if tp_size not in (None, 1):
        cfg = cfg.replace(device=rank_device(cfg.device))
        _styles().tensor_parallel(model, tensor_parallel_group(tp_size, cfg.device))
    elif device_map is not None:
        placed = resolve_device_map(model, device_map, max_memory)
        cfg = cfg.replace(device=placed["embed"])
    slices = parameter_slices(model)
    tensors = {}
    with torch.no_grad():
        for name in model.state_dict():
            device = cfg.device if placed is None else device_of_parameter(name, placed)
            tensors[name] = read(name, slices.get(name), device)
    model.load_state_dict(tensors, strict=True, assign=True)
    model.cfg = cfg
    for module_name, buffer_device in _buffer_devices(model, placed, cfg.device):
        torch.nn.Module.to(model.get_submodule(module_name), buffer_device)
    if placed is not None:
        follow_devices(model, placed)
    return model


def sharing_parameters(cls: type, model: Any, cfg: HookedTransformerConfig) -> Any:
    """A `cls` of `cfg` (the sizes of `model`'s config; other hook points or kernels) whose
    parameters are `model`'s own tensors, assigned rather than copied. A split `model`
    gets a twin split as it is (built on the meta device, split over the same ranks, then
    given this rank's slices), so nothing is gathered and nothing copied."""
    tp = getattr(model, "tp", None)
    twin = cls(cfg if tp is None else cfg.replace(device="meta"), tokenizer=model.tokenizer)
    if tp is not None:
        _styles().tensor_parallel(twin, tp)
    twin.load_state_dict(model.state_dict(keep_vars=True), strict=True, assign=True)
    if tp is not None:
        twin.cfg = cfg
        for module_name, buffer_device in _buffer_devices(twin, None, cfg.device):
            torch.nn.Module.to(twin.get_submodule(module_name), buffer_device)
    return twin


def _styles() -> Any:
    """The tensor-parallel plan's module, imported on first use (see the package's
    `__init__`: it brings in torch's compiler)."""
    from hookedattn.core.parallel import _styles

    return _styles


def _buffer_devices(model: Any, placed: Mapping[str, str] | None, device: str) -> list:
    """Where each module holding buffers (rotary frequencies, built on the CPU when the
    model was built on the meta device) must go: its parameters' device."""
    owners = {name.rpartition(".")[0] for name, _ in model.named_buffers()}
    return [(owner, _device_of(owner, placed, device)) for owner in sorted(owners)]


def _device_of(module: str, placed: Mapping[str, str] | None, default: str) -> str:
    if placed is None or not module:
        return default
    return device_of_parameter(f"{module}.x", placed)
