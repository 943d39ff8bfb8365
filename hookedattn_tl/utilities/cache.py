"""TransformerLens 3.x's `utilities.cache`: `get_pos_offset`."""

from typing import Any


def get_pos_offset(past_kv_cache: Any, batch_size: int) -> int:
    """How many positions a key/value cache already holds (0 for None): the position the
    next token takes."""
    if past_kv_cache is None:
        return 0
    return int(past_kv_cache.entries[0].past_keys.shape[1])


__all__ = ["get_pos_offset"]
