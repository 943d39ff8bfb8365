"""The token strings a view labels its positions with.

A cache holds activations, not the tokens it was run on, so a view takes them as an
argument: strings as they are, or ids (turned into strings by the model's tokenizer).
Without them they are read off the cached token embedding, which is a row of `W_E` at
every position, and failing that the positions are labelled by number.
"""

from typing import Any

import torch
from torch import Tensor

from hookedattn.core.cache import ActivationCache
from hookedattn.core.model import HookedTransformer


def _ids_from_embedding(
    model: HookedTransformer, cache: ActivationCache | None, batch: int
) -> list[int] | None:
    if cache is None or "hook_embed" not in cache or getattr(model, "embed", None) is None:
        return None
    embed = cache["hook_embed"]
    embed = embed[batch] if cache.has_batch_dim else embed
    W_E = model.embed.W_E.detach().to(embed.device, embed.dtype)
    ids = torch.cdist(embed, W_E).argmin(dim=-1)
    # A nearest row is the token only if it is the very row the embedding looked up.
    if not torch.allclose(W_E[ids], embed, rtol=1e-6, atol=1e-7):
        return None
    return ids.tolist()


def _strings_of_ids(model: HookedTransformer, ids: list[int]) -> list[str]:
    if getattr(model, "tokenizer", None) is None:
        return [str(i) for i in ids]
    return [str(s) for s in model.to_str_tokens(torch.tensor(ids))]


def token_strings(
    model: HookedTransformer, cache: ActivationCache | None, tokens: Any, batch: int, n: int
) -> list[str]:
    """`n` strings, one per position: from `tokens` (strings or ids), the cache, or numbers."""
    if tokens is None:
        ids = _ids_from_embedding(model, cache, batch)
        if ids is not None and len(ids) != n:
            raise ValueError(
                f"the cache has {len(ids)} positions and the result {n} (sliced?): pass "
                f"tokens=, the {n} token strings or ids of the positions it covers"
            )
        strings = [str(i) for i in range(n)] if ids is None else _strings_of_ids(model, ids)
    elif isinstance(tokens, list | tuple) and all(isinstance(t, str) for t in tokens):
        strings = list(tokens)
    else:
        ids = torch.as_tensor(tokens) if not isinstance(tokens, Tensor) else tokens
        if ids.dtype.is_floating_point or ids.ndim not in (1, 2):
            raise TypeError(
                f"tokens must be a list of strings or integer ids [pos] or [batch pos], "
                f"got {tokens!r}"
            )
        row = ids[batch] if ids.ndim == 2 else ids
        strings = _strings_of_ids(model, row.tolist())
    if len(strings) != n:
        raise ValueError(f"{len(strings)} tokens given for {n} positions: {strings[:8]!r}...")
    return strings
