"""What the model's forward accepts as input, checked: token ids or text, or a residual
stream (with `start_at_layer`). Bad input gets an error that names the expected shape,
dtype or range, rather than a failure deep inside the forward."""

from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from hookedattn.config import HookedTransformerConfig


def as_tokens(model: Any, input: Any) -> Int[Tensor, "batch pos"]:
    """Token ids `[batch pos]` from ids `[batch pos]`/`[pos]` or text, checked against the
    model's vocabulary and context (errors name the bad value and the valid range)."""
    if isinstance(input, str | list) and (isinstance(input, str) or _all_str(input)):
        return _tokenize(model, input)
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


def as_resid(cfg: HookedTransformerConfig, input: Any) -> Float[Tensor, "batch pos d_model"]:
    """The residual stream given with `start_at_layer`, checked: `[batch pos d_model]`."""
    shape = (cfg.d_model,)
    if not isinstance(input, Tensor) or input.ndim != 3 or tuple(input.shape[2:]) != shape:
        got = tuple(input.shape) if isinstance(input, Tensor) else type(input).__name__
        raise ValueError(
            f"with start_at_layer the input is the residual stream [batch pos "
            f"d_model={cfg.d_model}], got {got}"
        )
    return input


def _tokenize(model: Any, text: str | list[str]) -> Int[Tensor, "batch pos"]:
    if model.tokenizer is None:
        raise ValueError(
            "this model has no tokenizer, so it cannot read strings; pass token ids, "
            "or build the model with tokenizer="
        )
    return model.to_tokens(text)


def _all_str(items: list) -> bool:
    return bool(items) and all(isinstance(i, str) for i in items)
