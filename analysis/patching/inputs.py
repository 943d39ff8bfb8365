"""Checking what callers pass to the patching functions: token batches and metrics."""

from collections.abc import Callable

import torch
from jaxtyping import Float, Int
from torch import Tensor

from hookedattn import HookedTransformer

Metric = Callable[[Tensor], Tensor]


def as_tokens(model: HookedTransformer, tokens: object, what: str) -> Int[Tensor, "batch pos"]:
    """`tokens` as a `[batch pos]` tensor of ids (a `[pos]` tensor is a batch of one)."""
    if isinstance(tokens, str | list) and model.tokenizer is not None:
        tokens = model.to_tokens(tokens)
    if not isinstance(tokens, Tensor):
        raise TypeError(f"{what} must be token ids, a [batch pos] tensor; got {type(tokens)}")
    if tokens.dtype.is_floating_point or tokens.dtype == torch.bool:
        raise TypeError(f"{what} must be integer token ids, got a {tokens.dtype} tensor")
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2:
        raise ValueError(f"{what} must be [batch pos] token ids, got shape {tuple(tokens.shape)}")
    return tokens.to(model.cfg.device)


def paired_tokens(
    model: HookedTransformer, clean: object, corrupted: object
) -> tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
    """Clean and corrupted ids, which must have one shape: patches move position by position."""
    clean, corrupted = as_tokens(model, clean, "clean"), as_tokens(model, corrupted, "corrupted")
    if clean.shape != corrupted.shape:
        raise ValueError(
            f"clean tokens have shape {tuple(clean.shape)} but corrupted tokens "
            f"{tuple(corrupted.shape)}: patching swaps activations prompt by prompt and "
            f"position by position, so both must be [batch pos] of one shape"
        )
    return clean, corrupted


def metric_values(
    metric: Metric, logits: Float[Tensor, "batch pos d_vocab_out"]
) -> Float[Tensor, " batch"]:
    """`metric(logits)`, which must be one real number per prompt (shape `[batch]`)."""
    value = metric(logits)
    batch = logits.shape[0]
    if not isinstance(value, Tensor):
        raise TypeError(
            f"the metric must return a tensor with one value per prompt, shape ({batch},); "
            f"got {type(value).__name__}"
        )
    if value.shape != (batch,) or not value.dtype.is_floating_point:
        hint = " (drop a final .mean() or .sum())" if value.ndim == 0 else ""
        raise ValueError(
            f"the metric must return one value per prompt, a float tensor of shape "
            f"({batch},); got shape {tuple(value.shape)} and dtype {value.dtype}{hint}"
        )
    return value
