"""TransformerLens 3.x's `cache` package: the key/value cache and its entries."""

from hookedattn_tl.cache import key_value_cache, key_value_cache_entry
from hookedattn_tl.cache.key_value_cache import TransformerLensKeyValueCache
from hookedattn_tl.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry

__all__ = [
    "TransformerLensKeyValueCache",
    "TransformerLensKeyValueCacheEntry",
    "key_value_cache",
    "key_value_cache_entry",
]
