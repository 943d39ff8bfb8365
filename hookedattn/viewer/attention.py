"""The attention view: a prompt's tokens, and every head's pattern over them, as a `Page`.

    page = attention(model, "abcabc xyzxyz")        # runs the model on the text
    page = attention(model, cache, tokens)          # or reads the patterns of a cache
    page.save("attention.html")

On the page: the tokens as text; a layer and head chooser, or all heads side by side as
small multiples; hovering (or clicking, to keep it) a token colours every token by the
attention it pays as a query, or receives as a key; the pattern as a heatmap with the
tokens on both axes, each cell's exact value on hover.
"""

import operator
from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from hookedattn.core import is_text
from hookedattn.core.cache import ActivationCache
from hookedattn.core.model import HookedTransformer
from hookedattn.core.patterns import stacked_patterns
from hookedattn.viewer.page import Page, float32_base64
from hookedattn.viewer.tokens import token_strings

Patterns = Float[Tensor, "layer head query_pos key_pos"]
# Every pattern value the page holds (layers x heads x positions^2): 2**23 is 2 layers of
# 4 heads over 1,024 tokens, at most 43 MB of page (a causal model's, half that), which a
# browser still draws.
MAX_VALUES = 1 << 23


def _tokens(model: HookedTransformer, prompt: Any) -> Any:
    tokens = model.to_tokens(prompt) if is_text(prompt) else prompt
    if isinstance(tokens, Tensor) and tokens.ndim == 1:
        tokens = tokens[None]
    return tokens


def _is_int(value: object) -> bool:
    """An int, a numpy int or an int tensor of one element; not a bool, never a float."""
    if isinstance(value, bool):
        return False
    try:
        operator.index(value)
    except TypeError:
        return False
    return True


def _chosen_layers(layers: Sequence[int] | None, cfg: Any) -> list[int]:
    """The page's layers: all with attention (a hybrid's mixers have no patterns), or
    `layers`, each an int in range (a float would be cut) whose block has heads."""
    n_layers = cfg.n_layers
    chosen = cfg.attention_layers if layers is None else list(layers)
    if not chosen or not all(_is_int(i) and 0 <= operator.index(i) < n_layers for i in chosen):
        raise ValueError(
            f"layers must be a non-empty list of ints in 0..{n_layers - 1}, got {layers!r}"
        )
    chosen = [operator.index(layer) for layer in chosen]
    cfg.require_attention(f"the attention page of blocks {chosen}", chosen)
    return chosen


def _check_size(n_layers: int, n_heads: int, n_pos: int, n_seq: int, max_values: int) -> None:
    """Refuse more than `max_values` pattern values, before anything is computed."""
    n_values = n_layers * n_heads * n_pos * n_pos * n_seq
    if n_values > max_values:
        seqs = f" x {n_seq} sequences" if n_seq > 1 else ""
        raise ValueError(
            f"the attention page would hold {n_layers} layer(s) x {n_heads} heads x "
            f"{n_pos:,}^2 positions{seqs} = {n_values:,} pattern values (about "
            f"{n_values * 5.4 / 2**20:,.0f} MB of page), more than max_values={max_values:,}: "
            f"show fewer layers (layers=[...]), a shorter prompt, or raise max_values "
            f"(--max-values on the command line)"
        )


def _record(model: HookedTransformer, tokens: Any, layers: list[int]) -> ActivationCache:
    """The patterns of `layers` only, on `tokens`."""
    names = [f"blocks.{layer}.attn.hook_pattern" for layer in layers]
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens, names_filter=names, return_type=None)
    return cache


def _patterns(cache: ActivationCache, layers: Sequence[int], batch: int) -> Patterns:
    stacked = stacked_patterns(cache, layers, "the attention view")
    if not cache.has_batch_dim:
        return stacked
    n_batch = stacked.shape[1]
    if not -n_batch <= batch < n_batch:
        raise ValueError(f"batch must be in 0..{n_batch - 1} for this cache, got {batch}")
    return stacked[:, batch]


def _start(head: object, layers: list[int], n_heads: int) -> dict[str, Any]:
    if head == "all":
        return {"index": 0, "grid": True}
    if head is None:
        return {"index": 0, "grid": False}
    if isinstance(head, str) and head.startswith("L") and "H" in head:
        layer_text, _, head_text = head[1:].partition("H")
        if layer_text.isdigit() and head_text.isdigit():
            head = (int(layer_text), int(head_text))
    valid = (
        f"'L<layer>H<head>' or (layer, head) with layer in {layers} and head in 0..{n_heads - 1}"
    )
    if not (isinstance(head, tuple) and len(head) == 2 and all(isinstance(i, int) for i in head)):
        raise ValueError(f"head must be None, 'all', or {valid}; got {head!r}")
    layer, index = head
    if layer not in layers or not 0 <= index < n_heads:
        raise ValueError(f"head {head!r} is not on this page: give {valid}")
    return {"index": layers.index(layer) * n_heads + index, "grid": False}


def attention_data(
    patterns: Patterns, tokens: list[str], layers: list[int], head: object = None
) -> dict[str, Any]:
    """The JSON of an attention page: tokens, layers, and the patterns as float32.

    A causal model's patterns are zero above the diagonal; then only the lower triangle
    (row q: keys 0..q) is stored, which halves the page.
    """
    _, n_heads, n, _ = patterns.shape
    if len(tokens) != n:
        raise ValueError(f"{len(tokens)} token strings for patterns over {n} positions")
    upper = torch.ones(n, n, dtype=torch.bool, device=patterns.device).triu(1)
    triangle = not bool(patterns[..., upper].any())
    lower = ~upper
    stored = patterns[..., lower] if triangle else patterns
    return {
        "kind": "attention",
        "tokens": tokens,
        "layers": layers,
        "n_heads": n_heads,
        "patterns": {
            "layout": "layer head query_pos key_pos, row-major"
            + (", lower triangle only (keys 0..query_pos)" if triangle else ""),
            "dtype": "float32",
            "triangle": triangle,
            "base64": float32_base64(stored),
        },
        "start": _start(head, layers, n_heads),
    }


def attention(
    model: HookedTransformer,
    cache_or_text: Any,
    tokens: Any = None,
    *,
    layers: Sequence[int] | None = None,
    head: Any = None,
    batch: int = 0,
    title: str | None = None,
    max_values: int = MAX_VALUES,
) -> Page:
    """Every head's attention pattern over a prompt, as an interactive page.

    `cache_or_text` is a prompt (a string, or token ids `[pos]` / `[1 pos]`: the model is
    run on it) or an `ActivationCache` with the patterns; then `tokens` gives the token
    strings (a list of str) or ids, and without them they are read off the cached
    embedding (`hook_embed`) when it is there. `layers` limits the page to some layers
    (all that attend by default); `head` is the head shown first (`"L1H4"` or `(1, 4)`;
    `"all"` opens the small multiples); `batch` picks the sequence of a batched cache.

    The heatmap draws one cell per (query, key) pair and the page stores every head's
    pattern: a few hundred tokens and a few hundred heads keep it quick (16 heads over 128
    tokens make 0.7 MB); `layers` cuts a large model's page down. A page of more than
    `max_values` pattern values (layers x heads x positions^2, default 2**23) is refused
    before the model runs, with the sizes; raise `max_values` to make it anyway.
    """
    if model.cfg.n_layers == 0:
        raise ValueError("a model with 0 layers has no attention patterns to show")
    chosen = _chosen_layers(layers, model.cfg)
    if not _is_int(max_values) or operator.index(max_values) < 1:
        raise ValueError(f"max_values must be a positive int, got {max_values!r}")
    if isinstance(cache_or_text, ActivationCache):
        cache = cache_or_text
    else:
        tokens = _tokens(model, cache_or_text)
        shape = torch.as_tensor(tokens).shape
        n_seq = shape[0] if len(shape) == 2 else 1
        _check_size(len(chosen), model.cfg.n_heads, shape[-1], n_seq, max_values)
        cache = _record(model, tokens, chosen)
    patterns = _patterns(cache, chosen, batch)
    _check_size(len(chosen), patterns.shape[1], patterns.shape[-1], 1, max_values)
    strings = token_strings(model, cache, tokens, batch, patterns.shape[-1])
    data = attention_data(patterns, strings, chosen, head)
    # The title shows newlines and control characters as escapes, as the tokens do.
    joined = "".join(strings)
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in joined)
    shown = text if len(text) <= 60 else text[:57] + "..."
    return Page(title or f"attention: \u201c{shown}\u201d", data, height=900)
