"""TransformerLens 2.x's key/value cache module path (3.x: `cache`): the same classes.

`HookedTransformerKeyValueCache` is TL 2.x's name for `TransformerLensKeyValueCache`.
"""

from hookedattn_tl.cache.key_value_cache import TransformerLensKeyValueCache
from hookedattn_tl.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry

HookedTransformerKeyValueCache = TransformerLensKeyValueCache
HookedTransformerKeyValueCacheEntry = TransformerLensKeyValueCacheEntry

__all__ = [
    "HookedTransformerKeyValueCache",
    "HookedTransformerKeyValueCacheEntry",
    "TransformerLensKeyValueCache",
    "TransformerLensKeyValueCacheEntry",
]
