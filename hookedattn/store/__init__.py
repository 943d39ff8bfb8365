"""Dataset scale: activations streamed to disk, on one process or many under `torchrun`.

    from hookedattn.store import collect_activations, ActivationStore

    collect_activations(model, texts, names=["blocks.1.hook_resid_pre"], out="acts/",
                        context=128, batch_size=32, dtype=torch.bfloat16)
    store = ActivationStore("acts/")          # memory-mapped, nothing loaded eagerly
    for batch in store.batches("blocks.1.hook_resid_pre", 4096, shuffle=True, seed=0):
        ...                                   # [4096 d_model]

A store is a folder of safetensors shards and a JSON manifest (the layout is described in
`hookedattn/store/_manifest.py`); every byte read back is checked against the SHA-256
recorded when it was written, once per store object (`ActivationStore`'s docstring says
what is checked when). `sweep` maps any per-batch function of a model over a dataset,
each rank a share.
"""

from hookedattn.store._distributed import (
    RankInfo,
    barrier,
    current_rank,
    init_from_env,
    local_device_index,
)
from hookedattn.store._manifest import StoreError, read_manifest, weights_sha256
from hookedattn.store._stats import RunningStats
from hookedattn.store.collection import Collection, collect_activations, resolve_names
from hookedattn.store.inputs import PackedContexts, Packing, default_corpus, pack
from hookedattn.store.reader import ActivationStore, RowOrigin, StoreDataset
from hookedattn.store.sweep import SweepResult, load_sweep, save_sweep, sweep

__all__ = [
    "ActivationStore",
    "Collection",
    "PackedContexts",
    "Packing",
    "RankInfo",
    "RowOrigin",
    "RunningStats",
    "StoreDataset",
    "StoreError",
    "SweepResult",
    "barrier",
    "collect_activations",
    "current_rank",
    "default_corpus",
    "init_from_env",
    "load_sweep",
    "local_device_index",
    "pack",
    "read_manifest",
    "resolve_names",
    "save_sweep",
    "sweep",
    "weights_sha256",
]
