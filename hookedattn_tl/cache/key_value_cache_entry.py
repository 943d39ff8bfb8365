"""TransformerLens 3.x's `cache.key_value_cache_entry`: one layer's past keys and values."""

import torch

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.kv_cache import KeyValueCacheEntry


class TransformerLensKeyValueCacheEntry(KeyValueCacheEntry):
    """`hookedattn.KeyValueCacheEntry` with TL's `init_cache_entry(cfg, device, batch_size)`."""

    @classmethod
    def init_cache_entry(
        cls,
        cfg: HookedTransformerConfig,
        device: str | torch.device | None = None,
        batch_size: int = 1,
    ) -> "TransformerLensKeyValueCacheEntry":
        """An empty entry `[batch_size 0 kv_head d_head]` in the config's dtype (grouped
        configs get their key/value head count)."""
        n_kv_heads = getattr(cfg, "n_key_value_heads", None) or cfg.n_heads
        empty = torch.empty(
            (batch_size, 0, n_kv_heads, cfg.d_head), dtype=cfg.dtype, device=device or cfg.device
        )
        return cls(empty, empty.clone())


__all__ = ["TransformerLensKeyValueCacheEntry"]
