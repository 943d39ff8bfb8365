"""Dataset scale: activations streamed to disk, on one process or many under `torchrun`.

    from hookedattn.store import collect_activations, ActivationStore

    collect_activations(model, texts, names=["blocks.1.hook_resid_pre"], out="acts/",
                        context=128, batch_size=32, dtype=torch.bfloat16)
    store = ActivationStore("acts/")          # memory-mapped, nothing loaded eagerly
    for batch in store.batches("blocks.1.hook_resid_pre", 4096, shuffle=True, seed=0):
        ...                                   # [4096 d_model]

A store is a folder of safetensors shards and a JSON manifest (see `manifest`); `sweep`
maps any per-batch function of a model over a dataset, each rank a share.
"""

from hookedattn.store.collection import Collection, collect_activations, resolve_names
from hookedattn.store.distributed import RankInfo, init_from_env
from hookedattn.store.inputs import PackedContexts, Packing, default_corpus, pack
from hookedattn.store.manifest import StoreError, read_manifest, weights_sha256
from hookedattn.store.reader import ActivationStore, RowOrigin, StoreDataset
from hookedattn.store.stats import RunningStats
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
    "collect_activations",
    "default_corpus",
    "init_from_env",
    "load_sweep",
    "pack",
    "read_manifest",
    "resolve_names",
    "save_sweep",
    "sweep",
    "weights_sha256",
]
