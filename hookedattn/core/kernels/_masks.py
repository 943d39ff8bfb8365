"""Which keys each query may attend to, and the position of every token.

Computed once per forward and shared by every layer: a boolean `blocked` mask per kind of
attention ("global": causal; "local": causal and within the window), and the positions.
Without padding positions are `0..pos-1` (offset by the length of a KV cache). With an
`attention_mask`, padding keys are blocked and positions count real tokens only, so a
left-padded prompt gets the same positions as the prompt run alone. A padding query may
attend to itself (and to earlier real tokens), so that no row of the pattern is empty and
softmax never yields NaN; no real token ever reads a padding position.

The masks are built for the positions of this forward only (never `n_ctx x n_ctx`), so a
model with a long context costs nothing until it is given a long input. A local window
counts positions in the sequence as stored, padding included (as the reference
implementations of windowed models do); with padding only before a prompt, that is the same
as counting real tokens. A chunked window (`chunked`, Llama 4's chunked attention) cuts the
stored positions into fixed chunks of `window_size` instead: a query reads the keys of its
own chunk, up to itself.
"""

import dataclasses
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from hookedattn.core.kernels._guard import FiniteGuard
from hookedattn.core.kv_cache import KeyValueCache

Blocked = Bool[Tensor, "#batch 1 query_pos key_pos"]


@dataclasses.dataclass(frozen=True)
class AttentionContext:
    """What every attention layer of one forward needs besides its input.

    `blocked[kind]` is True where a query may not read a key, for each kind of attention
    ("global", and "local" in a model with a window); `guard` decides whether a fused
    kernel's result stands. `pos_embed` is the learned positional embedding of the queries'
    positions where every layer's queries and keys read it (shortformer models: the model
    adds it, `HookedTransformer.with_query_key_positions`); None otherwise.
    """

    blocked: dict[str, Blocked]
    positions: Int[Tensor, "batch query_pos"]
    # The kinds whose mask a fused kernel applies without reading a tensor: "causal" (a
    # fresh sequence without padding, in a global layer: the kernel's own causal mask) or
    # "none" (one query that may read every key: a generation step without padding).
    plain: dict[str, str] = dataclasses.field(default_factory=dict)
    pos_embed: Float[Tensor, "batch query_pos d_model"] | None = None
    # Every block's own input from the tokens (Gemma 4's per-layer inputs, read by
    # `PerLayerInputBlock`; `HookedTransformer.with_per_layer_inputs`); None otherwise.
    per_layer_inputs: Float[Tensor, "batch query_pos layer d_ple"] | None = None
    # The positions of every key (those of a KV cache first) where padding makes them other
    # than `0..n_keys-1`; None where it does not. Read by ALiBi (`components.alibi`).
    padded_key_positions: Int[Tensor, "batch key_pos"] | None = None
    # The keys and values a block computed for later blocks of its attention type to read,
    # by attention type, filled as the forward runs (`n_kv_shared_layers`:
    # `components.shared_kv_attention`); empty otherwise.
    shared_kv: dict[str, tuple[Tensor, Tensor]] = dataclasses.field(
        default_factory=dict, repr=False, compare=False
    )
    # How the forward's fused kernels are checked for non-finite values (`_guard`).
    guard: FiniteGuard = dataclasses.field(default_factory=FiniteGuard, repr=False, compare=False)
    _additive: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def additive(
        self, kind: str, dtype: torch.dtype
    ) -> Float[Tensor, "#batch 1 query_pos key_pos"]:
        """0 where a query may read a key, -inf where not, in `dtype` (built once per kind)."""
        key = (kind, dtype)
        if key not in self._additive:
            blocked = self.blocked[kind]
            zeros = torch.zeros(blocked.shape, dtype=dtype, device=blocked.device)
            self._additive[key] = zeros.masked_fill_(blocked, -torch.inf)
        return self._additive[key]

    def fused_mask(self, kind: str) -> tuple[Blocked | None, bool]:
        """What a fused kernel takes: where a query may read a key (None: no tensor needed),
        and whether to apply its own causal mask instead."""
        plain = self.plain.get(kind)
        if plain is not None:
            return None, plain == "causal"
        return ~self.blocked[kind], False

    def key_positions(self, n_keys: int) -> Int[Tensor, "batch key_pos"]:
        """The positions of the `n_keys` keys the queries read (a KV cache's, then theirs)."""
        if self.padded_key_positions is not None:
            return self.padded_key_positions
        keys = torch.arange(n_keys, device=self.positions.device)
        return keys.expand(self.positions.shape[0], n_keys)

    def reads_every_key(self, kind: str) -> bool:
        """Whether no query is blocked from any key (so a blocked key cannot leak a NaN)."""
        return self.plain.get(kind) == "none"


def attention_context(
    n_ctx: int,
    batch: int,
    n_new: int,
    # Loose on purpose: a mask of the wrong dtype or shape gets `_check_mask`'s error.
    attention_mask: Any,
    past_kv_cache: KeyValueCache | None,
    window_size: int | None,
    device: torch.device | str,
    chunked: bool = False,
) -> AttentionContext:
    """The masks and positions for `n_new` tokens following a KV cache (if any); `chunked`:
    the window is fixed chunks (module docstring)."""
    past = 0 if past_kv_cache is None else past_kv_cache.length
    if past + n_new > n_ctx:
        where = f" after {past} cached positions" if past else ""
        raise ValueError(
            f"sequence too long: {n_new} positions{where} exceed the model's n_ctx={n_ctx}"
        )
    if past_kv_cache is not None and past_kv_cache.batch != batch:
        raise ValueError(
            f"the KV cache holds {past_kv_cache.batch} sequences but the input has {batch}"
        )
    if attention_mask is not None:
        _check_mask(attention_mask, batch, n_new)
        attention_mask = attention_mask.long().to(device)  # booleans too: 0/1 ids from here
    full_mask = _full_mask(attention_mask, past_kv_cache, batch, n_new, device)
    unpadded = full_mask is None or bool(full_mask.all())
    if unpadded and n_new == 1:
        return _one_query(batch, past, window_size, device, chunked)
    if unpadded:
        positions = torch.arange(past, past + n_new, device=device).expand(batch, n_new)
        plain = {} if past else {"global": "causal"}
        # Built on first read: a forward whose layers all run fused never needs them.
        blocked = _Blocked(lambda: _blocked(past, n_new, None, window_size, device, chunked))
        return AttentionContext(blocked, positions, plain)
    if not bool(full_mask.any(dim=1).all()):
        empty = (~full_mask.bool().any(dim=1)).nonzero().flatten().tolist()
        raise ValueError(f"rows {empty} of the attention mask are all padding: nothing to run")
    key_positions = (full_mask.cumsum(dim=1) - 1).clamp(min=0)
    blocked = _blocked(past, n_new, full_mask, window_size, device, chunked)
    return AttentionContext(blocked, key_positions[:, past:], padded_key_positions=key_positions)


def rows_context(
    full_mask: Int[Tensor, "batch all_pos"],
    queries: Int[Tensor, " query_pos"],
    window_size: int | None,
    chunked: bool = False,
) -> AttentionContext:
    """The context of the queries at positions `queries` of a sequence already stored
    whole, its 0/1 mask `full_mask` (padding, if any, included): those rows of the forward
    over the whole sequence, for recomputing them written out after the sequence is done."""
    padded = not bool(full_mask.all())
    padding = full_mask if padded else None
    n_keys = full_mask.shape[1]
    blocked = _blocked_rows(queries[:, None], padding, window_size, n_keys, chunked)
    every = (full_mask.cumsum(dim=1) - 1).clamp(min=0)
    return AttentionContext(blocked, every[:, queries], padded_key_positions=every)


class _Blocked(dict):
    """`AttentionContext.blocked`, filled by `build()` when a kind is first read."""

    def __init__(self, build: Any) -> None:
        super().__init__()
        self._build = build

    def __missing__(self, kind: str) -> Blocked:
        self.update(self._build())
        return dict.__getitem__(self, kind)


def _blocked(
    past: int,
    n_new: int,
    full_mask: Int[Tensor, "batch all_pos"] | None,
    window_size: int | None,
    device: torch.device | str,
    chunked: bool = False,
) -> dict[str, Blocked]:
    """Where each query may not read a key: later keys, padding keys other than the query
    itself (`full_mask == 0`), and in a local layer keys `window_size` or more back (or,
    `chunked`, keys of another chunk)."""
    query = torch.arange(past, past + n_new, device=device)[:, None]
    return _blocked_rows(query, full_mask, window_size, past + n_new, chunked)


def _blocked_rows(
    query: Int[Tensor, "query_pos 1"],
    full_mask: Int[Tensor, "batch all_pos"] | None,
    window_size: int | None,
    n_keys: int,
    chunked: bool = False,
) -> dict[str, Blocked]:
    """`_blocked` for the queries at positions `query`, over keys `0..n_keys-1`."""
    key = torch.arange(n_keys, device=query.device)[None, :]
    blocked = {"global": (key > query)[None, None]}
    if full_mask is not None:
        padding = (full_mask == 0)[:, None, None, :] & (key != query)
        blocked["global"] = blocked["global"] | padding
    if window_size is not None and chunked:
        blocked["local"] = blocked["global"] | (query // window_size != key // window_size)
    elif window_size is not None:
        blocked["local"] = blocked["global"] | (query - key >= window_size)
    return blocked


def next_token_context(
    past_kv_cache: KeyValueCache, window_size: int | None, chunked: bool = False
) -> AttentionContext:
    """The context of one more real token per row after a cache that holds no padding,
    appended to the cache's mask: what a generation step needs, without the checks of
    `attention_context` (the generation loop has made them once for the whole run)."""
    batch, past = past_kv_cache.batch, past_kv_cache.length
    past_kv_cache.extend_by_real_token()
    return _one_query(batch, past, window_size, past_kv_cache.device, chunked)


def _one_query(
    batch: int,
    past: int,
    window_size: int | None,
    device: torch.device | str,
    chunked: bool = False,
) -> AttentionContext:
    """The context of one new token after `past` real ones: it reads every key, except, in
    a local layer, those `window_size` or more positions back (or, `chunked`, before its
    chunk: in the first chunk, `past < window_size`, none either way). Its masks, like a
    fresh sequence's, are built only if a layer reads them (a written-out or windowed one)."""
    positions = torch.full((batch, 1), past, device=device)
    plain = {"global": "none"}
    if window_size is not None and past < window_size:
        plain["local"] = "none"
    blocked = _Blocked(lambda: _blocked(past, 1, None, window_size, device, chunked))
    return AttentionContext(blocked, positions, plain)


def _full_mask(
    attention_mask: Int[Tensor, "batch pos"] | None,
    past_kv_cache: KeyValueCache | None,
    batch: int,
    n_new: int,
    device: torch.device | str,
) -> Int[Tensor, "batch all_pos"] | None:
    """The 0/1 mask of past and new positions together (stored in the cache unless frozen)."""
    if past_kv_cache is not None:
        new = attention_mask
        if new is None:
            new = torch.ones(batch, n_new, dtype=torch.long, device=device)
        return past_kv_cache.extend_mask(new)
    return attention_mask


def _check_mask(mask: object, batch: int, n_new: int) -> None:
    if not isinstance(mask, Tensor):
        raise TypeError(
            f"attention_mask must be a tensor of 0/1 ids [batch pos], got "
            f"{type(mask).__name__}; e.g. torch.tensor(mask)"
        )
    if mask.shape != (batch, n_new):
        raise ValueError(
            f"attention_mask has shape {tuple(mask.shape)} but the tokens are "
            f"{(batch, n_new)}; give one 0/1 entry per token"
        )
    if mask.dtype.is_floating_point or mask.dtype.is_complex:
        raise TypeError(f"attention_mask must hold integers or booleans, got {mask.dtype}")
    if bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError("attention_mask must hold only 0 (padding) and 1 (real token)")
