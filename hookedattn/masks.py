"""Which keys each query may attend to, and the position of every token.

Computed once per forward and shared by every layer. Without padding the mask is a slice of
the causal mask and positions are `0..pos-1` (offset by the length of a KV cache).
Attention adds the mask to its scores (0 where a key may be read, `-inf` where not), so
it is built here in the scores' dtype, once, rather than by each layer. With an
`attention_mask`, padding keys are blocked and positions count real tokens only, so a
left-padded prompt gets the same positions as the prompt run alone. A padding query may
attend to itself (and to earlier real tokens), so that no row of the pattern is empty and
softmax never yields NaN; no real token ever reads a padding position.
"""

import dataclasses

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from hookedattn.kv_cache import KeyValueCache


@dataclasses.dataclass(frozen=True)
class AttentionContext:
    """What every attention layer of one forward needs besides its input."""

    mask: Float[Tensor, "#batch 1 query_pos key_pos"]  # 0: may attend; -inf: may not
    positions: Int[Tensor, "batch query_pos"]


def causal_blocked(n_ctx: int, device: str | torch.device) -> Bool[Tensor, "n_ctx n_ctx"]:
    """`True` above the diagonal: query `i` may not attend to key `j > i`."""
    return torch.ones(n_ctx, n_ctx, dtype=torch.bool, device=device).triu(1)


def attention_context(
    causal: Bool[Tensor, "n_ctx n_ctx"],
    batch: int,
    n_new: int,
    # Loose on purpose: a mask of the wrong dtype or shape gets `_check_mask`'s error.
    attention_mask: Tensor | None,
    past_kv_cache: KeyValueCache | None,
    dtype: torch.dtype,
) -> AttentionContext:
    """The mask (in `dtype`) and positions for `n_new` tokens following a KV cache (if any)."""
    n_ctx = causal.shape[0]
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
    blocked = causal[past : past + n_new, : past + n_new]
    if attention_mask is not None:
        _check_mask(attention_mask, batch, n_new)
        attention_mask = attention_mask.long()  # booleans too, from here on 0/1 ids
    if past_kv_cache is not None:
        new = attention_mask if attention_mask is not None else _ones(batch, n_new, causal.device)
        full_mask = past_kv_cache.extend_mask(new)
    elif attention_mask is not None:
        full_mask = attention_mask
    else:
        full_mask = None
    if full_mask is None or bool(full_mask.all()):
        positions = torch.arange(past, past + n_new, device=causal.device).expand(batch, n_new)
        return AttentionContext(additive_mask(blocked, dtype)[None, None], positions)
    if not bool(full_mask.any(dim=1).all()):
        empty = (~full_mask.bool().any(dim=1)).nonzero().flatten().tolist()
        raise ValueError(f"rows {empty} of the attention mask are all padding: nothing to run")
    positions = (full_mask.cumsum(dim=1) - 1).clamp(min=0)[:, past:]
    is_pad_key = (full_mask == 0)[:, None, None, :]
    query_abs = torch.arange(past, past + n_new, device=causal.device)[:, None]
    is_self = query_abs == torch.arange(past + n_new, device=causal.device)[None, :]
    return AttentionContext(additive_mask(blocked | (is_pad_key & ~is_self), dtype), positions)


def additive_mask(
    blocked: Bool[Tensor, "*batch query_pos key_pos"], dtype: torch.dtype
) -> Float[Tensor, "*batch query_pos key_pos"]:
    """`-inf` where a key is blocked, 0 elsewhere: adding it is `masked_fill(blocked, -inf)`.

    The same numbers, but an add over `[batch head query_pos key_pos]` costs a fraction of a
    broadcast `masked_fill`, which was a tenth of a small model's forward.
    """
    return torch.zeros(blocked.shape, dtype=dtype, device=blocked.device).masked_fill_(
        blocked, -torch.inf
    )


def _ones(batch: int, n: int, device: torch.device) -> Int[Tensor, "batch pos"]:
    return torch.ones(batch, n, dtype=torch.long, device=device)


def _check_mask(mask: Tensor, batch: int, n_new: int) -> None:
    if mask.shape != (batch, n_new):
        raise ValueError(
            f"attention_mask has shape {tuple(mask.shape)} but the tokens are "
            f"{(batch, n_new)}; give one 0/1 entry per token"
        )
    if mask.dtype.is_floating_point or mask.dtype.is_complex:
        raise TypeError(f"attention_mask must hold integers or booleans, got {mask.dtype}")
    if bool(((mask != 0) & (mask != 1)).any()):
        raise ValueError("attention_mask must hold only 0 (padding) and 1 (real token)")
