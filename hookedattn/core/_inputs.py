"""The forward's input stage: whatever `HookedTransformer.forward` is given, the residual
stream entering the first block it runs, with the attention context every layer shares.

    text          -> tokens (+ mask)      tokenized, padded; no BOS after cached positions
    tokens        -> checked ids          integer, [batch pos], in 0..d_vocab-1, within n_ctx
    ids, mask     -> AttentionContext     masks and positions (after a KV cache, if any)
    ids           -> resid                the embedding (hook_embed, hook_pos_embed)
    resid given   -> checked stream       with start_at_layer: [batch pos d_model]
    positions     -> context.pos_embed    shortformer: W_pos[positions] for the queries
                                          and keys (hook_pos_embed), with either input

`prepare` runs these once, in this order, and returns a `Prepared`; the forward then runs
the blocks, the unembedding and the loss. Bad input gets an error naming the expected shape,
dtype or range here, before any layer runs.
"""

import dataclasses
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from hookedattn.core import _tokenization
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.kernels import AttentionContext, attention_context, next_token_context
from hookedattn.core.kv_cache import KeyValueCache
from hookedattn.core.shapes import Resid

RETURN_TYPES = ("logits", "loss", "both", None)


@dataclasses.dataclass(frozen=True)
class Prepared:
    """The forward's input after the input stage: the stream entering block `start`, the
    shared attention context, the blocks to run (`start..stop-1`), and the tokens and mask a
    loss needs (None where the input was a residual stream without `tokens=`)."""

    resid: Resid
    context: AttentionContext
    start: int
    stop: int
    tokens: Int[Tensor, "batch pos"] | None
    attention_mask: Tensor | None  # as given (0/1 ids or booleans), checked by the context


def prepare(
    model: Any,
    input: Any,
    *,
    return_type: Any,
    start_at_layer: Any,
    stop_at_layer: Any,
    tokens: Any,
    attention_mask: Any,
    past_kv_cache: KeyValueCache | None,
) -> Prepared:
    """Check and convert the forward's arguments, embed, and build the attention context."""
    start, stop = _layer_bounds(model.cfg, start_at_layer, stop_at_layer, return_type)
    if start_at_layer is None:
        if _tokenization.is_text(input):
            input, attention_mask = _text(model, input, attention_mask, past_kv_cache)
        tokens = as_tokens(model, input)
        context = _context(model, tokens.shape, attention_mask, past_kv_cache)
        resid = model.embed_tokens(tokens, context.positions)
        context = model.with_per_layer_inputs(
            model.with_query_key_positions(context), tokens, resid
        )
        return Prepared(resid, context, start, stop, tokens, attention_mask)
    resid = _as_resid(model.cfg, input)
    if tokens is not None:
        tokens = as_tokens(model, tokens)
        if tokens.shape != resid.shape[:2]:
            raise ValueError(
                f"tokens= has shape {tuple(tokens.shape)} but the residual stream is "
                f"{tuple(resid.shape[:2])} (batch, pos): give the tokens of this stream"
            )
    context = _context(model, resid.shape[:2], attention_mask, past_kv_cache)
    context = model.with_per_layer_inputs(model.with_query_key_positions(context), tokens, None)
    return Prepared(resid, context, start, stop, tokens, attention_mask)


def prepare_next_token(
    model: Any, tokens: Int[Tensor, "batch 1"], past_kv_cache: KeyValueCache
) -> tuple[Resid, AttentionContext]:
    """The input stage of a generation step: one chosen token per row after a cache of
    real tokens. Nothing to check (the generation loop chose the ids, and checked the run
    once); the cache's mask gains the new position."""
    context = next_token_context(past_kv_cache, model.cfg.window_size, model.cfg.window_chunked)
    resid = model.embed_tokens(tokens, context.positions)
    context = model.with_query_key_positions(context)
    return resid, model.with_per_layer_inputs(context, tokens, resid)


def as_tokens(model: Any, input: Any) -> Int[Tensor, "batch pos"]:
    """Token ids `[batch pos]` from ids `[batch pos]`/`[pos]` or text, checked against the
    model's vocabulary and context (errors name the bad value and the valid range)."""
    if _tokenization.is_text(input):
        return _tokenization.tokenize(model, input).tokens
    if not isinstance(input, Tensor):
        raise TypeError(f"expected token ids as a tensor, got {type(input).__name__}")
    if input.dtype.is_floating_point or input.dtype.is_complex or input.dtype == torch.bool:
        raise TypeError(
            f"expected integer token ids, got a {input.dtype} tensor of shape "
            f"{tuple(input.shape)}; to feed a residual stream use start_at_layer="
        )
    if input.is_meta:
        raise ValueError("token ids on the meta device hold no values: pass real ids")
    input = input.long()  # uint8, int16, ...: the embedding lookup reads int64 ids
    if input.ndim == 1:
        input = input[None]
    if input.ndim != 2:
        raise ValueError(f"token ids must be [batch pos] or [pos], got shape {tuple(input.shape)}")
    if input.numel():
        low, high = (int(bound) for bound in torch.aminmax(input))  # one pass, not two
        if low < 0 or high >= model.cfg.d_vocab:
            bad = low if low < 0 else high
            raise ValueError(
                f"token id {bad} is out of range: ids must be in 0..{model.cfg.d_vocab - 1} "
                f"(d_vocab={model.cfg.d_vocab})"
            )
    if input.shape[1] > model.cfg.n_ctx:
        raise ValueError(
            f"sequence too long: {input.shape[1]} positions exceed the model's "
            f"n_ctx={model.cfg.n_ctx}"
        )
    return input.to(model.cfg.device)


def _text(
    model: Any, text: Any, attention_mask: Any, past_kv_cache: KeyValueCache | None
) -> tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"] | None]:
    """Tokens and mask for strings (right-padded); the mask is None when nothing is padded,
    so that a string runs exactly as its token ids do. Continuing after cached positions, no
    BOS goes in the middle of the sequence."""
    if attention_mask is not None:
        raise TypeError(
            "strings bring their own attention mask; to give one, pass token ids "
            "(model.tokenize(...) returns both)"
        )
    continuing = past_kv_cache is not None and past_kv_cache.length > 0
    batch = _tokenization.tokenize(model, text, prepend_bos=False if continuing else None)
    mask = None if bool(batch.attention_mask.all()) else batch.attention_mask
    return batch.tokens, mask


def _as_resid(cfg: HookedTransformerConfig, input: Any) -> Resid:
    """The residual stream given with `start_at_layer`, checked: `[batch pos d_model]`."""
    shape = (cfg.d_model,)
    if not isinstance(input, Tensor) or input.ndim != 3 or tuple(input.shape[2:]) != shape:
        got = tuple(input.shape) if isinstance(input, Tensor) else type(input).__name__
        raise ValueError(
            f"with start_at_layer the input is the residual stream [batch pos "
            f"d_model={cfg.d_model}], got {got}"
        )
    return input


def _layer_bounds(
    cfg: HookedTransformerConfig, start_at_layer: Any, stop_at_layer: Any, return_type: Any
) -> tuple[int, int]:
    if return_type not in RETURN_TYPES:
        raise ValueError(
            f"return_type must be 'logits', 'loss', 'both' or None, got {return_type!r}"
        )
    n = cfg.n_layers
    for name, value in (("start_at_layer", start_at_layer), ("stop_at_layer", stop_at_layer)):
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= n:
            raise ValueError(
                f"{name} must be an int in 0..{n} (n_layers={n}), got {value!r}; negative "
                f"layers are not counted from the end here"
            )
    start = 0 if start_at_layer is None else start_at_layer
    stop = n if stop_at_layer is None else stop_at_layer
    if start > stop:
        raise ValueError(f"start_at_layer={start} is after stop_at_layer={stop}")
    return start, stop


def _context(
    model: Any, shape: tuple[int, ...], attention_mask: Any, past_kv_cache: KeyValueCache | None
) -> AttentionContext:
    batch, n_new = shape
    cfg = model.cfg
    device = model.embed.W_E.device  # `model.W_E` gathers in a tensor-parallel model
    return attention_context(
        cfg.n_ctx,
        batch,
        n_new,
        attention_mask,
        past_kv_cache,
        cfg.window_size,
        device,
        chunked=cfg.window_chunked,
    )
