"""The key-value cache: keys and values of positions already run, so that generation runs
each new token alone instead of the whole sequence again.

This is the question "what happens in parallel, what in sequence" (asked by the project's
worklog, `docs/guide/worklog.md`) made concrete: a forward over `n` tokens computes all `n`
positions at once, and running them one at a time against this cache gives the same
numbers, because position `i` only ever reads keys and values of positions `<= i`.

A hybrid model's mixers (the sublayers in attention's place, or Falcon-H1's beside it:
`components.block.make_mixer`) keep a cache of their own kind, `MixerCacheEntry`: what a
mixer reads of earlier positions (a recurrence's state, its convolution's last inputs, or,
where its equation reads every earlier position as attention does, their keys), kept as
each mixer's module says. A forward with the cache runs the mixer's own equations on the
new positions only, so its hook points see those positions, as attention's do, and an
edit of a value the cache keeps is kept with it.
"""

from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from hookedattn.core.config import HookedTransformerConfig


class KeyValueCacheEntry:
    """One layer's past keys and values, `[batch pos kv_head d_head]` (keys after rotation;
    values `d_head_v` wide, which differs from `d_head` in latent attention).

    Appending stores the new positions in buffers with room to spare (doubled when full),
    so that a generation step copies its own token, not the whole past again;
    `past_keys` and `past_values` are views of the filled part. Tensors given to the
    constructor are never written to: the first append copies them into a buffer. An entry
    made by `preallocated` owns buffers of a given capacity from the start (generation
    knows how many positions it will need), so no append ever copies the past.
    """

    def __init__(
        self,
        past_keys: Float[Tensor, "batch pos head d_head"],
        past_values: Float[Tensor, "batch pos head d_head_v"],
        frozen: bool = False,
    ) -> None:
        self.frozen = frozen
        self._set(past_keys, past_values)
        self._sides: dict[str, KeyValueCacheEntry] = {}
        self._mixer: MixerCacheEntry | None = None  # a mixer beside the attention's

    @classmethod
    def preallocated(
        cls,
        batch: int,
        capacity: int,
        n_heads: int,
        d_head: int,
        dtype: torch.dtype,
        device: str | torch.device,
        d_head_v: int | None = None,
    ) -> "KeyValueCacheEntry":
        """An empty entry owning buffers of `capacity` positions (it grows past them if
        asked to, as any entry does); values `d_head_v` wide (default `d_head`)."""
        d_head_v = d_head if d_head_v is None else d_head_v
        keys, values = (
            torch.empty((batch, capacity, n_heads, width), dtype=dtype, device=device)
            for width in (d_head, d_head_v)
        )
        entry = cls(keys.narrow(1, 0, 0), values.narrow(1, 0, 0))
        entry._keys, entry._values, entry._owned = keys, values, True
        return entry

    @property
    def capacity(self) -> int:
        """How many positions the buffers hold before an append must grow them."""
        return self._keys.shape[1] if self._owned else self._length

    def _set(self, keys: Tensor, values: Tensor) -> None:
        self._keys, self._values = keys, values
        self._length = keys.shape[1]
        self._owned = False  # whether the buffers are ours to write into

    @property
    def past_keys(self) -> Float[Tensor, "batch pos head d_head"]:
        """The keys of the positions so far."""
        return self._keys[:, : self._length]  # indexing: cheaper than `narrow`

    @past_keys.setter
    def past_keys(self, keys: Float[Tensor, "batch pos head d_head"]) -> None:
        """Replace the past keys (read, never written to)."""
        self._set(keys, self.past_values)

    @property
    def past_values(self) -> Float[Tensor, "batch pos head d_head_v"]:
        """The values of the positions so far."""
        return self._values[:, : self._length]

    @past_values.setter
    def past_values(self, values: Float[Tensor, "batch pos head d_head_v"]) -> None:
        """Replace the past values (read, never written to)."""
        self._set(self.past_keys, values)

    def append(
        self,
        new_keys: Float[Tensor, "batch new_pos head d_head"],
        new_values: Float[Tensor, "batch new_pos head d_head_v"],
    ) -> tuple[
        Float[Tensor, "batch all_pos head d_head"], Float[Tensor, "batch all_pos head d_head_v"]
    ]:
        """Past and new keys and values together; stored unless the cache is frozen."""
        if self.frozen:
            return (
                torch.cat([self.past_keys, new_keys], dim=1),
                torch.cat([self.past_values, new_values], dim=1),
            )
        start, end = self._length, self._length + new_keys.shape[1]
        if not self._owned or end > self._keys.shape[1]:
            # Room to spare only once the entry grows again: a single append (a forward
            # with the cache, a patching pass) gets what it needs, as a concatenation would.
            capacity = max(end, 2 * start) if self._owned else end
            self._keys = _grown(self.past_keys, new_keys, capacity)
            self._values = _grown(self.past_values, new_values, capacity)
            self._owned = True
        self._keys[:, start:end] = new_keys
        self._values[:, start:end] = new_values
        self._length = end
        return self.past_keys, self.past_values

    def side(
        self, name: str, new_keys: Float[Tensor, "batch new_pos head d_side"]
    ) -> Float[Tensor, "batch all_pos head d_side"]:
        """Past and new keys of a second kind that this layer keeps beside its attention's
        (a lightning indexer's: `components.indexer`), stored as this entry's are: appended
        unless frozen, forgotten by `truncate`. Called before this entry's own `append`."""
        entry = self._sides.get(name)
        if entry is None:
            if self._length:
                raise ValueError(
                    f"this cache entry holds {self._length} positions but no {name} keys for "
                    f"them: a cache made without them cannot be read by this layer"
                )
            empty = new_keys.narrow(1, 0, 0)
            entry = self._sides[name] = KeyValueCacheEntry(empty, empty[..., :0])
        entry.frozen = self.frozen
        return entry.append(new_keys, new_keys[..., :0])[0]

    def beside(self) -> "MixerCacheEntry":
        """The cache of the mixer beside this layer's attention (Falcon-H1's), frozen as
        this entry is; made empty if this entry holds no positions yet."""
        if self._mixer is None:
            if self._length:
                raise ValueError(
                    f"this cache entry holds {self._length} positions but no cache of the "
                    f"mixer beside its attention: a cache made without one cannot be read here"
                )
            self._mixer = MixerCacheEntry()
        self._mixer.frozen = self.frozen
        return self._mixer

    @property
    def device(self) -> torch.device:
        """Where the keys are kept."""
        return self._keys.device

    def frozen_copy(self, device: str | torch.device) -> "KeyValueCacheEntry":
        """A frozen copy of this entry on `device`, its side keys and mixer too (read, never
        stored into: what a layer placed on another device reads)."""
        copy = KeyValueCacheEntry(self.past_keys.to(device), self.past_values.to(device), True)
        copy._sides = {name: entry.frozen_copy(device) for name, entry in self._sides.items()}
        copy._mixer = None if self._mixer is None else self._mixer.frozen_copy(device)
        return copy

    def _snapshot(self) -> Any:
        """What `_restore` puts back: the length (and the snapshot of a mixer beside)."""
        return self._length if self._mixer is None else (self._length, self._mixer._snapshot())

    def _restore(self, snapshot: Any) -> None:
        if isinstance(snapshot, int):
            self.truncate(snapshot)
            self._mixer = None  # made by the forward undone, if at all
            return
        self.truncate(snapshot[0])
        self._mixer._restore(snapshot[1])

    def truncate(self, length: int) -> None:
        """Forget every position from `length` on (undoing appends; the buffers are kept)."""
        self._length = min(self._length, length)
        for entry in self._sides.values():
            entry.truncate(length)

    def __repr__(self) -> str:
        batch, pos, head, d_head = self.past_keys.shape
        frozen = ", frozen" if self.frozen else ""
        return f"KeyValueCacheEntry(batch={batch}, pos={pos}, head={head}, d_head={d_head}{frozen})"


def _grown(
    past: Float[Tensor, "batch pos *rest"], new: Float[Tensor, "batch new_pos *rest"], capacity: int
) -> Float[Tensor, "batch capacity *rest"]:
    """A buffer of `capacity` positions holding `past` (new positions are written after)."""
    n_past = past.shape[1]
    dtype = torch.promote_types(past.dtype, new.dtype)
    shape = (new.shape[0], capacity, *new.shape[2:])
    buffer = torch.empty(shape, dtype=dtype, device=new.device)
    buffer.narrow(1, 0, n_past).copy_(past)
    return buffer


class MixerCacheEntry:
    """One mixer's cache (module docstring): tensors it keeps for every position so far
    (`rows`: appended as keys are, in buffers with room to spare), and values it carries
    from the last position to the next (`carried`, `carry`: a recurrence's state, its
    convolution's last inputs), replaced by each forward. A frozen entry is read and left
    as it is; so is `NO_PAST`, the empty entry of a forward without a cache."""

    def __init__(self, capacity: int = 0, frozen: bool = False) -> None:
        self.capacity, self.frozen = capacity, frozen  # capacity: positions, as `empty`'s
        self._rows: dict[str, Tensor] = {}
        self._lengths: dict[str, int] = {}
        self._carried: dict[str, Tensor] = {}

    @property
    def length(self) -> int:
        """How many positions the entry holds rows of (0 where it keeps none)."""
        return max(self._lengths.values(), default=0)

    @property
    def device(self) -> torch.device | None:
        """Where the entry's tensors are kept (None while it holds none)."""
        held = [*self._rows.values(), *self._carried.values()]
        return held[0].device if held else None

    def rows(
        self, name: str, new: Float[Tensor, "batch new_pos *rest"]
    ) -> Float[Tensor, "batch all_pos *rest"]:
        """The earlier positions' `name` and `new` together; `new` stored unless frozen."""
        buffer, start = self._rows.get(name), self._lengths.get(name, 0)
        if self.frozen:
            return new if buffer is None else torch.cat([buffer[:, :start], new], dim=1)
        end = start + new.shape[1]
        if buffer is None or end > buffer.shape[1]:
            past = new[:, :0] if buffer is None else buffer[:, :start]
            buffer = self._rows[name] = _grown(past, new, max(end, 2 * start, self.capacity))
        buffer[:, start:end] = new
        self._lengths[name] = end
        return buffer[:, :end]

    def carried(self, name: str) -> Tensor | None:
        """What the last forward carried on as `name` (None before the first)."""
        return self._carried.get(name)

    def carry(self, name: str, value: Tensor) -> None:
        """Carry `value` on to the next forward as `name`, unless frozen: a copy, since a
        view (the last of a forward's states) would keep the whole forward's tensor."""
        if not self.frozen:
            self._carried[name] = value.clone()

    def frozen_copy(self, device: str | torch.device) -> "MixerCacheEntry":
        """A frozen copy on `device` (what a layer placed on another device reads)."""
        copy = MixerCacheEntry(self.capacity, frozen=True)
        copy._rows = {name: rows[:, : self._lengths[name]].to(device)
                      for name, rows in self._rows.items()}  # fmt: skip
        copy._lengths = dict(self._lengths)
        copy._carried = {name: value.to(device) for name, value in self._carried.items()}
        return copy

    def _snapshot(self) -> tuple[dict[str, int], dict[str, Tensor]]:
        """What `_restore` puts back: each kind of rows' length, and the carried values
        (replaced by a forward, never written into)."""
        return dict(self._lengths), dict(self._carried)

    def _restore(self, snapshot: tuple[dict[str, int], dict[str, Tensor]]) -> None:
        lengths, carried = snapshot
        self._lengths = {name: lengths.get(name, 0) for name in self._lengths}
        self._carried = carried

    def __repr__(self) -> str:
        frozen = ", frozen" if self.frozen else ""
        kept = [*self._rows, *self._carried]
        return f"MixerCacheEntry(pos={self.length}, keeps={kept}{frozen})"


# The cache of a forward without one: empty, and frozen, so nothing is ever stored in it.
NO_PAST = MixerCacheEntry(frozen=True)

LayerEntry = KeyValueCacheEntry | MixerCacheEntry


class KeyValueCache:
    """Every layer's `KeyValueCacheEntry` and the attention mask of the positions so far.

    Build an empty one with `KeyValueCache.empty(cfg, batch)` and pass it to the model's
    forward as `past_kv_cache=`; each forward appends its positions. A frozen cache is read
    but not extended (TransformerLens's `freeze()`).

    A generation step's one real token per row is noted as a count (`extend_by_real_token`)
    and joins the mask only when `previous_attention_mask` is read: a step that reads no
    mask then costs no concatenation of the whole mask.
    """

    def __init__(
        self,
        entries: list[LayerEntry],
        previous_attention_mask: Int[Tensor, "batch pos"],
        frozen: bool = False,
    ) -> None:
        self.entries = entries
        self._mask = previous_attention_mask
        self._real_after_mask = 0  # real positions after `_mask`, not yet joined to it
        self.frozen = frozen

    def __repr__(self) -> str:
        return (
            f"KeyValueCache(layers={len(self.entries)}, batch={self.batch}, "
            f"length={self.length}, frozen={self.frozen})"
        )

    @property
    def previous_attention_mask(self) -> Int[Tensor, "batch pos"]:
        """The 0/1 mask of every position the cache holds (1: a real token, 0: padding)."""
        if self._real_after_mask:
            real = torch.ones(
                (self.batch, self._real_after_mask), dtype=torch.long, device=self._mask.device
            )
            self._mask, self._real_after_mask = torch.cat([self._mask, real], dim=1), 0
        return self._mask

    @previous_attention_mask.setter
    def previous_attention_mask(self, mask: Int[Tensor, "batch pos"]) -> None:
        """Replace the mask (and any real positions noted after it)."""
        self._mask, self._real_after_mask = mask, 0

    @property
    def device(self) -> torch.device:
        """Where the mask is kept."""
        return self._mask.device

    @classmethod
    def empty(
        cls,
        cfg: HookedTransformerConfig,
        batch: int,
        device: str | torch.device | None = None,
        capacity: int = 0,
    ) -> "KeyValueCache":
        """A cache holding no positions yet, for a batch of `batch` sequences; with
        `capacity`, every layer's buffers hold that many positions from the start (what
        generation does: it knows the prompt and `max_new_tokens`), but those of blocks
        reading an earlier block's keys and values, which stay empty. A hybrid model's
        mixers get a `MixerCacheEntry` each."""
        device = cfg.device if device is None else device
        if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 0:
            raise ValueError(f"capacity must be an int >= 0, got {capacity!r}")
        # A block reading an earlier block's keys and values (`n_kv_shared_layers`) reads
        # that block's entry: its own holds nothing.
        own = lambda layer: capacity if cfg.kv_source_layer(layer) is None else 0
        entries = [_layer_entry(cfg, layer, batch, own(layer), device)
                   for layer in range(cfg.n_layers)]  # fmt: skip
        mask = torch.empty(batch, 0, dtype=torch.long, device=device)
        return cls(entries, mask)

    @property
    def length(self) -> int:
        """How many positions the cache holds."""
        return self._mask.shape[1] + self._real_after_mask

    @property
    def batch(self) -> int:
        """How many sequences the cache holds."""
        return self._mask.shape[0]

    def __getitem__(self, layer: int) -> LayerEntry:
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

    def transaction(self) -> "_Transaction":
        """All or nothing: if the body raises, every layer and the mask are as before it.

        A forward that fails part-way (a hook raising in layer 1) would otherwise leave
        layers of different lengths, and a retry would append its tokens twice.
        """
        return _Transaction(self)

    def extend_mask(self, new_mask: Int[Tensor, "batch new_pos"]) -> Int[Tensor, "batch all_pos"]:
        """The mask of past and new positions together; stored unless frozen."""
        if new_mask.dtype != torch.long:
            new_mask = new_mask.long()
        mask = torch.cat([self.previous_attention_mask, new_mask], dim=1)
        if not self.frozen:
            self.previous_attention_mask = mask
        return mask

    def extend_by_real_token(self) -> None:
        """One more real token per row (a generation step's), unless frozen: noted, and
        joined to the mask when it is next read."""
        if not self.frozen:
            self._real_after_mask += 1


def _layer_entry(
    cfg: HookedTransformerConfig, layer: int, batch: int, capacity: int, device: str | torch.device
) -> LayerEntry:
    """An empty entry for block `layer`: its attention's keys and values (and the cache of
    a mixer beside it), or its mixer's cache (an empty one for a block of an MLP alone)."""
    kind = cfg.layer_mixer(layer)
    if kind != "attention":
        return MixerCacheEntry(capacity)
    entry = _preallocated(cfg.attention_config(layer), batch, capacity, device)
    if cfg.mixers is not None and cfg.mixers.beside_attention is not None:
        entry._mixer = MixerCacheEntry(capacity)
    return entry


def _preallocated(
    cfg: HookedTransformerConfig, batch: int, capacity: int, device: str | torch.device
) -> KeyValueCacheEntry:
    """An empty entry for a block whose attention `cfg` describes (its own key/value heads
    and widths: `HookedTransformerConfig.attention_config`)."""
    return KeyValueCacheEntry.preallocated(
        batch, capacity, cfg.n_kv_heads, cfg.d_head, cfg.dtype, device, cfg.d_value
    )


class _Transaction:
    """`KeyValueCache.transaction()`: the entries and mask noted on entry, put back if the
    body raises. (A class rather than `@contextmanager`: a generation step enters one per
    token, where the generator's machinery costs more than the bookkeeping.)"""

    def __init__(self, cache: KeyValueCache) -> None:
        self.cache = cache

    def __enter__(self) -> None:
        cache = self.cache
        self.snapshots = [entry._snapshot() for entry in cache.entries]
        self.mask = (cache._mask, cache._real_after_mask)

    def __exit__(self, kind: type | None, error: BaseException | None, traceback: Any) -> None:
        if kind is None:
            return
        cache = self.cache
        for entry, snapshot in zip(cache.entries, self.snapshots, strict=True):
            entry._restore(snapshot)
        cache._mask, cache._real_after_mask = self.mask
