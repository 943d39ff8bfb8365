"""TransformerLens's key/value cache names: `TransformerLensKeyValueCache.init_cache`.

The cache is ours (`hookedattn.KeyValueCache`); this subclass adds TL's constructor.
`HookedTransformerKeyValueCache` is TL 2.x's name for the same class.
"""

import torch

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.kv_cache import KeyValueCache, KeyValueCacheEntry


class TransformerLensKeyValueCache(KeyValueCache):
    """`hookedattn.KeyValueCache` with TL's `init_cache(cfg, device, batch_size)`."""

    @classmethod
    def init_cache(
        cls,
        cfg: HookedTransformerConfig,
        device: str | torch.device | None = None,
        batch_size: int = 1,
    ) -> "TransformerLensKeyValueCache":
        """An empty cache for `batch_size` sequences, to pass as `past_kv_cache=`."""
        return cls.empty(cfg, batch_size, device)


HookedTransformerKeyValueCache = TransformerLensKeyValueCache
TransformerLensKeyValueCacheEntry = KeyValueCacheEntry
HookedTransformerKeyValueCacheEntry = KeyValueCacheEntry

__all__ = [
    "HookedTransformerKeyValueCache",
    "HookedTransformerKeyValueCacheEntry",
    "TransformerLensKeyValueCache",
    "TransformerLensKeyValueCacheEntry",
]
