"""The key-value cache: keys and values of positions already run, so that generation runs
each new token alone instead of the whole sequence again.

This is the seed worklog's question "what happens in parallel, what in sequence" made
concrete: a forward over `n` tokens computes all `n` positions at once, and running them one
at a time against this cache gives the same numbers, because position `i` only ever reads
keys and values of positions `<= i`.
"""

import dataclasses

import torch
from jaxtyping import Float, Int
from torch import Tensor

from hookedattn.config import HookedTransformerConfig


@dataclasses.dataclass
class KeyValueCacheEntry:
    """One layer's past keys and values, `[batch pos head d_head]` (keys after rotation)."""

    past_keys: Float[Tensor, "batch pos head d_head"]
    past_values: Float[Tensor, "batch pos head d_head"]
    frozen: bool = False

    def append(
        self,
        new_keys: Float[Tensor, "batch new_pos head d_head"],
        new_values: Float[Tensor, "batch new_pos head d_head"],
    ) -> tuple[
        Float[Tensor, "batch all_pos head d_head"], Float[Tensor, "batch all_pos head d_head"]
    ]:
        """Past and new keys and values together; stored unless the cache is frozen."""
        keys = torch.cat([self.past_keys, new_keys], dim=1)
        values = torch.cat([self.past_values, new_values], dim=1)
        if not self.frozen:
            self.past_keys, self.past_values = keys, values
        return keys, values


@dataclasses.dataclass
class KeyValueCache:
    """Every layer's `KeyValueCacheEntry` and the attention mask of the positions so far.

    Build an empty one with `KeyValueCache.empty(cfg, batch)` and pass it to the model's
    forward as `past_kv_cache=`; each forward appends its positions. A frozen cache is read
    but not extended (TransformerLens's `freeze()`).
    """

    entries: list[KeyValueCacheEntry]
    previous_attention_mask: Int[Tensor, "batch pos"]
    frozen: bool = False

    @classmethod
    def empty(
        cls, cfg: HookedTransformerConfig, batch: int, device: str | torch.device | None = None
    ) -> "KeyValueCache":
        """A cache holding no positions yet, for a batch of `batch` sequences."""
        device = cfg.device if device is None else device
        shape = (batch, 0, cfg.n_heads, cfg.d_head)
        entries = [
            KeyValueCacheEntry(
                torch.empty(shape, dtype=cfg.dtype, device=device),
                torch.empty(shape, dtype=cfg.dtype, device=device),
            )
            for _ in range(cfg.n_layers)
        ]
        mask = torch.empty(batch, 0, dtype=torch.long, device=device)
        return cls(entries, mask)

    @property
    def length(self) -> int:
        """How many positions the cache holds."""
        return self.previous_attention_mask.shape[1]

    @property
    def batch(self) -> int:
        """How many sequences the cache holds."""
        return self.previous_attention_mask.shape[0]

    def __getitem__(self, layer: int) -> KeyValueCacheEntry:
        return self.entries[layer]

    def __len__(self) -> int:
        return len(self.entries)

    def freeze(self) -> None:
        """Stop appending: later forwards read the cache but leave it as it is."""
        self.frozen = True
        for entry in self.entries:
            entry.frozen = True

    def unfreeze(self) -> None:
        """Append again."""
        self.frozen = False
        for entry in self.entries:
            entry.frozen = False

    def extend_mask(self, new_mask: Int[Tensor, "batch new_pos"]) -> Int[Tensor, "batch all_pos"]:
        """The mask of past and new positions together; stored unless frozen."""
        mask = torch.cat([self.previous_attention_mask, new_mask.to(torch.long)], dim=1)
        if not self.frozen:
            self.previous_attention_mask = mask
        return mask
