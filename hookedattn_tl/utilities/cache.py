"""TransformerLens 3.x's `utilities.cache`: `get_pos_offset`."""

from typing import Any


def get_pos_offset(past_kv_cache: Any, batch_size: int) -> int:
    """How many positions a key/value cache already holds (0 for None): the position the
    next token takes."""
    if past_kv_cache is None:
        return 0
    return past_kv_cache.length  # its mask's: a hybrid's first layer may hold a mixer


__all__ = ["get_pos_offset"]
