"""Models beyond one device: tensor parallelism under `torchrun`, and device maps.

    # torchrun --nproc_per_node 2 script.py            (gloo on CPUs, NCCL on GPUs)
    model = HookedTransformer.from_hf("path/to/llama", tp_size=2)   # each rank reads its slices
    logits, cache = model.run_with_cache(tokens)     # on every rank: the whole model's

    model = HookedTransformer.from_hf("path/to/llama", device_map="auto")  # blocks over GPUs

Tensor parallelism (`tensor_parallel`, built on torch's `DeviceMesh` and
`parallelize_module` with one `ParallelStyle` per kind of module) splits attention heads
(query heads with the key/value heads they read), MLP neurons (each expert's, in a mixture
of experts), a gated delta net's heads and the vocabulary over the ranks; a hybrid's other
mixers run whole on every rank (`_mixers`). Each rank runs the components' own forwards on
its slices; one collective per sublayer joins them (`_sublayers`). Every rank's model
behaves as the whole model: full logits, and hooks and caches that see whole activations,
gathered only at hook points that something reads (`ShardedHookPoint`);
`local_activations` turns the gathering off.

A device map (`place`) puts whole blocks on devices and moves the residual stream at block
boundaries; nothing is split, so nothing is communicated but the stream.

Every rank runs the same program: the same inputs, hooks and calls, in the same order.
"""

from typing import Any

from hookedattn.core.parallel._building import build_model, sharing_parameters
from hookedattn.core.parallel._device_map import (
    balanced_slots,
    check_device,
    infer_device_map,
    n_devices_map,
    place,
    resolve_device_map,
    unit_bytes,
)
from hookedattn.core.parallel._group import (
    TensorParallelGroup,
    same_on_every_rank,
    tensor_parallel_group,
)
from hookedattn.core.parallel._hook_points import (
    ShardedHookPoint,
    local_activations,
    sharded_hook_points,
)
from hookedattn.core.parallel._model import (
    TensorParallelModel,
    dtensor_state_dict,
    full_state_dict,
    refuse_tensor_parallel,
)
from hookedattn.core.parallel._sharding import parameter_slices
from hookedattn.core.parallel._shards import LocalSlice, check_tp_size

# The plan (`_styles`) builds on `torch.distributed.tensor`, whose import brings in torch's
# compiler (1.5 to 2.5 s on a 2-core machine): its names are imported on first use, so that
# a model on one device never pays for it.
_STYLES = frozenset(
    ("HeadParallel", "HeadParallelInputs", "NeuronParallel", "VocabParallel",
     "tensor_parallel", "tensor_parallel_plan")
)  # fmt: skip


def __getattr__(name: str) -> Any:
    """The tensor-parallel plan's names, imported from `_styles` when first asked for."""
    if name in _STYLES:
        from hookedattn.core.parallel import _styles

        return getattr(_styles, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "HeadParallel",
    "HeadParallelInputs",
    "LocalSlice",
    "NeuronParallel",
    "ShardedHookPoint",
    "TensorParallelGroup",
    "TensorParallelModel",
    "VocabParallel",
    "balanced_slots",
    "build_model",
    "check_device",
    "check_tp_size",
    "dtensor_state_dict",
    "full_state_dict",
    "infer_device_map",
    "local_activations",
    "n_devices_map",
    "parameter_slices",
    "place",
    "refuse_tensor_parallel",
    "resolve_device_map",
    "same_on_every_rank",
    "sharded_hook_points",
    "sharing_parameters",
    "tensor_parallel",
    "tensor_parallel_group",
    "tensor_parallel_plan",
    "unit_bytes",
]
