"""What a tensor-parallel model adds to a `HookedTransformer`: its weight views gather.

The forward is the model's own (`HookedTransformer.forward`); its sublayers are the sharded
ones (`_sublayers`). The parameters (`named_parameters`, `state_dict`) are this rank's
slices, as a distributed checkpoint stores them; the circuits-notation views read whole
weights, so analysis written for one process (`model.OV`, `model.W_U`, ...) gives its
one-process answer. Each view is a collective: every rank must read it.
"""

import math
from typing import Any

from torch import Tensor

from hookedattn.core.parallel._collectives import gather
from hookedattn.core.parallel._group import TensorParallelGroup
from hookedattn.core.parallel._sharding import parameter_slices

# The axis of one layer's stacked weight that is cut, and the config field of its size.
_STACKED = {
    **{w: (0, "n_heads") for w in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V")},
    "W_in": (1, "d_mlp"),
    "b_in": (0, "d_mlp"),
    "W_out": (0, "d_mlp"),
}


class TensorParallelModel:
    """Mixin of a `HookedTransformer` split over the ranks of `tp` (see the module)."""

    tp: TensorParallelGroup

    def _stacked(self, module: str, weight: str) -> Tensor:
        local = super()._stacked(module, weight)
        part = self._cut(0, module, weight)  # every layer alike, or stacking refused
        if part is None:
            return local  # replicated: every rank holds all of it
        return gather(local, part[0] + 1, part[1], self.tp)  # +1: `layer`

    def layer_weight(self, layer: int, module: str, weight: str) -> Tensor:
        """Block `layer`'s `module.weight`, gathered from every rank when it is sharded."""
        local = super().layer_weight(layer, module, weight)
        part = self._cut(layer, module, weight)
        return local if part is None else gather(local, part[0], part[1], self.tp)

    def _cut(self, layer: int, module: str, weight: str) -> tuple[int, int] | None:
        """(axis, whole size) of block `layer`'s `module.weight` where it is sharded: as the
        module recorded its cut (an MLP's, a mixture of experts' on its neuron axis), else
        as `_STACKED` says (the attention's views of its fused weight); None: whole."""
        recorded = getattr(getattr(self.blocks[layer], module), "local_slices", {})
        if weight in recorded:
            return recorded[weight].axis, recorded[weight].size
        if weight not in _STACKED:
            return None
        axis, field = _STACKED[weight]
        return axis, getattr(self.cfg, field)

    def key_value_weights(self, layer: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Block `layer`'s `W_K, b_K, W_V, b_V` per key/value head, gathered from every rank."""
        W_K, b_K, W_V, b_V = (
            gather(w, 0, self.cfg.n_kv_heads, self.tp) for w in super().key_value_weights(layer)
        )
        return W_K, b_K, W_V, b_V

    @property
    def W_E(self) -> Tensor:
        """Token embedding `[d_vocab d_model]`, gathered from every rank."""
        return gather(self.embed.W_E, 0, self.cfg.d_vocab, self.tp)

    @property
    def W_U(self) -> Tensor:
        """Unembedding `[d_model d_vocab_out]`, gathered from every rank."""
        return gather(self.unembed.W_U, 1, self.cfg.d_vocab_out, self.tp)

    @property
    def b_U(self) -> Tensor:
        """Unembedding bias `[d_vocab_out]`, gathered from every rank."""
        return gather(self.unembed.b_U, 0, self.cfg.d_vocab_out, self.tp)


def refuse_tensor_parallel(model: Any, what: str, why: str) -> None:
    """A ValueError if `model` is split over ranks: `what` (a method) is refused on it,
    for the reason `why`, and the remedy (one process) is named."""
    tp = getattr(model, "tp", None)
    if tp is not None:
        raise ValueError(
            f"{what} on a tensor-parallel model (tp_size={tp.size}) are refused: {why}; load "
            f"the model in one process for them"
        )


def full_state_dict(model: Any) -> dict[str, Tensor]:
    """The one-process state dict of a tensor-parallel model: each sharded parameter
    gathered from every rank (a collective: every rank must call it), the rest as held."""
    slices = parameter_slices(model)
    tensors = {}
    for name, tensor in model.state_dict().items():
        part = slices.get(name)
        tensors[name] = tensor if part is None else gather(tensor, part.axis, part.size, model.tp)
    return tensors


def dtensor_state_dict(model: Any) -> dict[str, Any]:
    """The state dict of a tensor-parallel model as DTensors over its mesh: each sharded
    parameter this rank's slice as `Shard(axis)` of the whole, the rest `Replicate()`;
    what `torch.distributed.checkpoint` saves and loads shard by shard. No data moves."""
    # Imported here: `torch.distributed.tensor` brings in torch's compiler (package docstring).
    from torch.distributed.tensor import DTensor, Replicate, Shard

    slices = parameter_slices(model)
    tensors = {}
    for name, tensor in model.state_dict().items():
        part = slices.get(name)
        if part is None:
            tensors[name] = DTensor.from_local(tensor, model.tp.mesh, [Replicate()])
            continue
        shape = list(tensor.shape)
        shape[part.axis] = part.size
        stride = [math.prod(shape[i + 1 :]) for i in range(len(shape))]
        tensors[name] = DTensor.from_local(
            tensor, model.tp.mesh, [Shard(part.axis)], shape=tuple(shape), stride=tuple(stride)
        )
    return tensors
