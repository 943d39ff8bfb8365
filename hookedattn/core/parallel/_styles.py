"""The tensor-parallel plan of a `HookedTransformer`: torch's `parallelize_module` with one
`ParallelStyle` per kind of module.

    plan = tensor_parallel_plan(model.cfg)
    # {"embed": VocabParallel, "blocks.0": HeadParallelInputs, "blocks.0.attn": HeadParallel,
    #  ..., "blocks.0.mlp": NeuronParallel, ..., "unembed": VocabParallel}
    parallelize_module(model, mesh, plan)       # what `tensor_parallel(model, group)` runs

Each style cuts its module's parameters to this rank's slice in place (`_sublayers`). The
weights are not scattered from rank 0 (torch's styles do that by default): every rank
already holds the same model, built from one seed or read from one checkpoint, and a
loader reads only its slices. A mixture of experts is split by `NeuronParallel` too: each
rank holds its neurons of every expert (`[expert ...]` weights cut on their neuron axis),
the router whole, so that every rank routes alike and each expert's hook points gather as
the dense MLP's do. A hybrid's gated delta nets and Mamba-2 mixers are split by heads
(`MixerParallel`); its other mixers are in no entry: they run whole on every rank.
"""

from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor.parallel import parallelize_module
from torch.distributed.tensor.parallel.style import ParallelStyle

from hookedattn.core.components.embed import Embed, Unembed
from hookedattn.core.components.latent_attention import LatentAttention
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.parallel import _latent, _mixers, _sublayers
from hookedattn.core.parallel._group import TensorParallelGroup
from hookedattn.core.parallel._model import TensorParallelModel
from hookedattn.core.parallel._shards import check_tp_size


class _HookedStyle(ParallelStyle):
    """A style that knows the model's config (the sizes each module's axes are cut from)."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        self.cfg = cfg

    def _apply(self, module: nn.Module, device_mesh: DeviceMesh) -> nn.Module:
        self.shard(module, self.cfg, TensorParallelGroup(device_mesh))
        return module

    def shard(self, module: nn.Module, cfg: HookedTransformerConfig, tp: TensorParallelGroup):
        """Cut `module` to this rank's slice, in place."""
        raise NotImplementedError


class HeadParallel(_HookedStyle):
    """Attention: this rank's query heads and the key/value heads they read (`W_Q`, `W_K`,
    `W_V`, their biases and `W_O` cut on the head axis); the output summed over ranks."""

    def shard(self, module: nn.Module, cfg: HookedTransformerConfig, tp: TensorParallelGroup):
        """Cut the attention (or latent attention) to this rank's heads."""
        if isinstance(module, LatentAttention):
            _latent.shard_latent_attention(module, cfg, tp)
        else:
            _sublayers.shard_attention(module, cfg, tp)


class HeadParallelInputs(_HookedStyle):
    """A block's attention inputs: the stream entering the sharded heads, and per-head
    input copies (`hook_attn_in`, `hook_q_input`, ...) made for this rank's heads."""

    def shard(self, module: nn.Module, cfg: HookedTransformerConfig, tp: TensorParallelGroup):
        """Make the block's attention inputs this rank's."""
        _sublayers.shard_attention_inputs(module, cfg, tp)


class NeuronParallel(_HookedStyle):
    """MLP: this rank's neurons (`W_in`, `W_gate`, `b_in` columns, `W_out` rows; of every
    expert in a mixture of experts, and of its shared expert); the output summed over
    ranks."""

    def shard(self, module: nn.Module, cfg: HookedTransformerConfig, tp: TensorParallelGroup):
        """Cut the MLP to this rank's neurons."""
        _sublayers.shard_mlp(module, cfg, tp)


class MixerParallel(_HookedStyle):
    """A hybrid's gated delta net or Mamba-2 mixer: this rank's heads, their writes summed
    over ranks (`_mixers`); whole on every rank where its heads do not divide over the
    ranks."""

    def shard(self, module: nn.Module, cfg: HookedTransformerConfig, tp: TensorParallelGroup):
        """Cut the mixer to this rank's heads, where it splits."""
        _mixers.shard_mixer(module, cfg, tp)


class VocabParallel(_HookedStyle):
    """Embedding or unembedding: this rank's part of the vocabulary (`W_E` rows, `W_U` and
    `b_U` columns); the lookup summed, the logits gathered over ranks."""

    def shard(self, module: nn.Module, cfg: HookedTransformerConfig, tp: TensorParallelGroup):
        """Cut the (un)embedding to this rank's part of the vocabulary."""
        if isinstance(module, Embed):
            _sublayers.shard_embed(module, cfg, tp)
        elif isinstance(module, Unembed):
            _sublayers.shard_unembed(module, cfg, tp)
        else:
            raise TypeError(f"VocabParallel cuts an Embed or Unembed, got {type(module).__name__}")


def tensor_parallel_plan(cfg: HookedTransformerConfig) -> dict[str, ParallelStyle]:
    """The `parallelize_module` plan of a model of `cfg`: module paths to styles, one
    entry per split module (`blocks.0.attn`, `blocks.0.mlp`, ...).

    A hybrid's blocks are named as they hold attention, an MLP, a gated delta net or a
    Mamba-2 mixer (split by its heads where they divide); its other mixers are in no entry,
    so each runs whole on every rank, reading the whole stream every rank holds (their
    weights replicated)."""
    plan: dict[str, ParallelStyle] = {"embed": VocabParallel(cfg)}
    for layer in cfg.attention_layers:
        if not cfg.is_latent_attention:  # latent attention's heads take their own inputs
            plan[f"blocks.{layer}"] = HeadParallelInputs(cfg)
        plan[f"blocks.{layer}.attn"] = HeadParallel(cfg)
    for layer in range(cfg.n_layers):
        if cfg.layer_has_mlp(layer):
            plan[f"blocks.{layer}.mlp"] = NeuronParallel(cfg)
        if cfg.mixers is not None and set(cfg.mixers.layer_mixers(layer)) & _mixers.SPLIT:
            plan[f"blocks.{layer}.mixer"] = MixerParallel(cfg)
    plan["unembed"] = VocabParallel(cfg)
    return plan


def tensor_parallel(model: Any, group: TensorParallelGroup | DeviceMesh) -> Any:
    """Split `model` over the ranks of `group` (a `TensorParallelGroup` or a 1-D
    `DeviceMesh`), in place, and return it.

    Every rank must call this with the same model (same config and weights): each keeps
    its own slice. Afterwards the model behaves on every rank as the whole model does
    (full logits, whole activations at hooks and in caches, gathered where read); its
    parameters are this rank's slices (`parameter_slices(model)` says which), and its
    weight views (`model.W_Q`, `model.W_U`, ...) gather the whole weights.
    """
    if not isinstance(group, TensorParallelGroup):
        group = TensorParallelGroup(group)
    if isinstance(model, TensorParallelModel):
        raise ValueError("this model is already split over ranks")
    check_tp_size(model.cfg, group.size)
    parallelize_module(model, group.mesh, tensor_parallel_plan(model.cfg), src_data_rank=None)
    _swap_model_class(model)
    model.tp = group
    model.setup()  # the new hook points get their names
    return model


_MODEL_CLASSES: dict[type, type] = {}


def _swap_model_class(model: Any) -> None:
    base = type(model)
    if base not in _MODEL_CLASSES:
        _MODEL_CLASSES[base] = type(
            f"TensorParallel{base.__name__}",
            (TensorParallelModel, base),
            {"__module__": TensorParallelModel.__module__},
        )
    model.__class__ = _MODEL_CLASSES[base]
