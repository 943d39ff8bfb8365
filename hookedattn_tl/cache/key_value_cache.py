"""TransformerLens 3.x's `cache.key_value_cache`: the cache a generation passes along."""

import torch

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.kv_cache import KeyValueCache
from hookedattn_tl.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry


class TransformerLensKeyValueCache(KeyValueCache):
    """`hookedattn.KeyValueCache` (`entries`, `previous_attention_mask`) with TL's
    `init_cache(cfg, device, batch_size)`."""

    @classmethod
    def init_cache(
        cls,
        cfg: HookedTransformerConfig,
        device: str | torch.device | None = None,
        batch_size: int = 1,
    ) -> "TransformerLensKeyValueCache":
        """An empty cache for `batch_size` sequences, to pass as `past_kv_cache=`."""
        return cls.empty(cfg, batch_size, device)


__all__ = ["TransformerLensKeyValueCache", "TransformerLensKeyValueCacheEntry"]
