"""The three steps that make a module its rank's part, whatever its style (`_sublayers`,
`_mixers`): its parameters narrowed to this rank's slices (`narrow_parameters`, recorded in
`local_slices`, which the loaders and the weight views read), its hook points made sharded
ones (`shard_hook_point`), and its class given the style's mixin (`swap_class`, whose
combine steps replace the component's own).
"""

from torch import nn

from hookedattn.core.parallel._group import TensorParallelGroup
from hookedattn.core.parallel._hook_points import ShardedHookPoint
from hookedattn.core.parallel._shards import LocalSlice


def present(module: nn.Module) -> set[str]:
    """The names of `module`'s own parameters, less those registered as None (an optional
    parameter the model does not have, such as `sinks` without attention sinks)."""
    return {name for name, param in module._parameters.items() if param is not None}


def narrow_parameters(module: nn.Module, slices: dict[str, LocalSlice]) -> None:
    """Replace each named parameter by its slice (a copy of it, so the whole can be
    freed; on the meta device, a meta tensor of the slice's shape)."""
    for name, part in slices.items():
        param = module._parameters[name]
        piece = param.detach().narrow(part.axis, part.start, part.length)
        if not piece.is_meta:
            piece = piece.clone()
        module._parameters[name] = nn.Parameter(piece, requires_grad=param.requires_grad)
    module.local_slices = {**getattr(module, "local_slices", {}), **slices}


def shard_hook_point(
    module: nn.Module,
    name: str,
    part: LocalSlice,
    tp: TensorParallelGroup,
    alternatives: tuple[LocalSlice, ...] = (),
) -> None:
    """Replace the hook point `module.name` (if it has one) by a sharded one, keeping any
    hooks attached to it."""
    old = module._modules.get(name)
    if old is None:
        return
    new = ShardedHookPoint(tp, part, alternatives)
    new.name, new.ctx = old.name, old.ctx
    for handle in (*old._fwd, *old._bwd):
        handle.hook_point = new
    new._fwd, new._bwd = old._fwd, old._bwd
    new._update_active()
    setattr(module, name, new)


_SHARDED_CLASSES: dict[tuple[type, type], type] = {}


def swap_class(module: nn.Module, mixin: type) -> None:
    """Give `module` the class `mixin + type(module)` (made once per pair)."""
    base = type(module)
    if issubclass(base, mixin):
        return
    key = (mixin, base)
    if key not in _SHARDED_CLASSES:
        name = f"TensorParallel{base.__name__}"
        _SHARDED_CLASSES[key] = type(name, (mixin, base), {"__module__": mixin.__module__})
    module.__class__ = _SHARDED_CLASSES[key]


def parameter_slices(model: nn.Module) -> dict[str, LocalSlice]:
    """Every sharded parameter of `model` by its state-dict name, with this rank's slice."""
    return {
        f"{prefix}.{name}" if prefix else name: part
        for prefix, module in model.named_modules()
        for name, part in getattr(module, "local_slices", {}).items()
    }
