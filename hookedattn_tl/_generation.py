"""Sampling with TransformerLens's `freq_penalty`, which the core generator does not have.

TL subtracts `freq_penalty * count(t)` from the temperature-scaled logit of every token `t`
already in the sequence (prompt included), then applies top-k and top-p. Our
`choose_next_tokens` divides by the temperature itself, so the penalty goes in multiplied
by the temperature: `(logits - T p c) / T = logits / T - p c`.
"""

from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from hookedattn.core import _tokenization
from hookedattn.core._generation import Sampling, choose_next_tokens
from hookedattn.core.kv_cache import KeyValueCache


def token_counts(
    tokens: Int[Tensor, "batch pos"], d_vocab: int
) -> Float[Tensor, "batch d_vocab_out"]:
    """How many times each token id occurs in each row."""
    counts = torch.zeros(tokens.shape[0], d_vocab, dtype=torch.float64, device=tokens.device)
    return counts.scatter_add_(1, tokens, torch.ones_like(tokens, dtype=torch.float64))


@torch.no_grad()
def generate_with_freq_penalty(
    model: Any, input: Any, max_new_tokens: int, freq_penalty: float, options: dict[str, Any]
) -> Any:
    """TL's `generate(..., freq_penalty=p)` for prompts of one length (no padding)."""
    text_in = _tokenization.is_text(input)
    if text_in:
        batch = model.tokenize(input, options["prepend_bos"], "left")
        if not bool(batch.attention_mask.all()):
            raise ValueError(
                "freq_penalty with prompts of different lengths is not supported; "
                "generate them one at a time"
            )
        tokens = batch.tokens
    else:
        tokens = model._as_tokens(input)
    sampling = Sampling(True, options["temperature"], options["top_k"], options["top_p"])
    eos = options["eos_token_id"]
    if eos is None and model.tokenizer is not None:
        eos = _tokenization.tokenizer_of(model).eos_token_id
    stop = options["stop_at_eos"] and eos is not None
    generator = options.get("generator")
    cache = KeyValueCache.empty(model.cfg, tokens.shape[0])
    finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    sequence, new = tokens, tokens
    for _ in range(max_new_tokens):
        logits = model(new, past_kv_cache=cache)[:, -1].to(torch.float64)
        penalty = sampling.temperature * freq_penalty * token_counts(sequence, logits.shape[-1])
        chosen = choose_next_tokens(logits - penalty, sampling, generator)
        if stop:
            chosen = torch.where(finished, torch.full_like(chosen, eos), chosen)
            finished = finished | (chosen == eos)
        new = chosen[:, None]
        sequence = torch.cat([sequence, new], dim=1)
        if stop and bool(finished.all()):
            break
    return_type = options["return_type"]
    if return_type == "tokens" or (return_type == "input" and not text_in):
        return sequence
    texts = [model.to_string(row) for row in sequence]
    return texts[0] if isinstance(input, str) else texts
