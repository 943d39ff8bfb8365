"""What a generation is asked to do, checked once: `GenerationOptions` (how each token is
chosen, when a row ends, how the steps run) and `Prompt` (the ids to continue and their
mask). `generate`, `generate_steps` and `generate_stream` take the options as keyword
arguments (`with_options` gives each of them the fields in its signature, so that
`help(model.generate)` lists them) and the loop reads them from here only.
"""

import dataclasses
import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from hookedattn.core import _tokenization
from hookedattn.core.generation._sampling import Sampling


@dataclasses.dataclass(frozen=True, kw_only=True)
class GenerationOptions:
    """How a prompt is continued, token by token.

    Greedy unless `do_sample`; sampling divides the logits by `temperature`, keeps the
    `top_k` most likely tokens, then those whose probability reaches `top_p`, drawing from
    `generator`, or with `seed` (an int, or one per row) from one generator per row, so that
    a row gets the same tokens whatever batch it is in. `freq_penalty` lowers each token's
    (temperature-scaled) logit by that much for every time the token already occurs in its
    row, prompt included (TransformerLens's `freq_penalty`). A row ends at `eos_token_id`
    (an id or several; by default the tokenizer's EOS) with `stop_at_eos`, once its
    generated text contains one of `stop_strings`, or after its own `max_new_tokens` (an int,
    or one per row). `use_past_kv_cache` runs each new token alone against a KV cache
    (the same logits as running the whole sequence again); `prepend_bos` as in `to_tokens`,
    for text prompts.
    """

    max_new_tokens: int | Sequence[int] = 10
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    freq_penalty: float = 0.0
    stop_at_eos: bool = True
    eos_token_id: int | Sequence[int] | None = None
    stop_strings: str | Sequence[str] | None = None
    use_past_kv_cache: bool = True
    prepend_bos: bool | None = None
    generator: torch.Generator | None = None
    seed: int | Sequence[int] | None = None

    def __post_init__(self) -> None:
        self.sampling  # noqa: B018 (checks temperature, top_k and top_p)
        _check_max_new_tokens(self.max_new_tokens)
        penalty = self.freq_penalty
        if not isinstance(penalty, int | float) or isinstance(penalty, bool):
            raise TypeError(f"freq_penalty must be a number, got {penalty!r}")
        if not math.isfinite(penalty):
            raise ValueError(f"freq_penalty must be finite, got {penalty!r}")
        if self.seed is not None and self.generator is not None:
            raise ValueError("give seed= (one generator per row) or generator=, not both")

    @property
    def sampling(self) -> Sampling:
        """How the next token is chosen from the logits."""
        return Sampling(self.do_sample, self.temperature, self.top_k, self.top_p)

    @property
    def n_steps(self) -> int:
        """How many tokens the longest row may get."""
        limits = self.max_new_tokens
        return limits if isinstance(limits, int) else max(limits, default=0)

    @property
    def limits(self) -> list[int] | None:
        """Each row's own `max_new_tokens`, where one is given per row."""
        return None if isinstance(self.max_new_tokens, int) else list(self.max_new_tokens)


OPTION_NAMES = tuple(field.name for field in dataclasses.fields(GenerationOptions))


def options_of(max_new_tokens: Any, options: dict[str, Any]) -> GenerationOptions:
    """The `GenerationOptions` of an entry point's keyword arguments (a `TypeError` naming
    an unknown one and the valid ones)."""
    unknown = sorted(set(options) - set(OPTION_NAMES))
    if unknown:
        raise TypeError(
            f"unknown generation option(s) {unknown}; the options are {list(OPTION_NAMES)}"
        )
    return GenerationOptions(max_new_tokens=max_new_tokens, **options)


def with_options(fn: Callable) -> Callable:
    """`fn`, whose `**options` are `GenerationOptions`' fields, with those fields in its
    signature (what `help()` and editors show), after its own positional parameters."""
    signature = inspect.signature(fn)
    own = [p for p in signature.parameters.values() if p.kind is not p.VAR_KEYWORD]
    present = {p.name for p in own}
    fields = [
        inspect.Parameter(
            f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default, annotation=f.type
        )
        for f in dataclasses.fields(GenerationOptions)
        if f.name not in present
    ]
    positional = [p for p in own if p.kind is not p.KEYWORD_ONLY]
    keyword = [p for p in own if p.kind is p.KEYWORD_ONLY]
    fn.__signature__ = signature.replace(parameters=[*positional, *fields, *keyword])
    return fn


def _check_max_new_tokens(limits: Any) -> None:
    values = limits if isinstance(limits, Sequence) and not isinstance(limits, str) else [limits]
    for n in values:
        if not isinstance(n, int) or isinstance(n, bool):
            raise TypeError(f"max_new_tokens must be an int or a list of ints, got {n!r}")
        if n < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {n}")


@dataclasses.dataclass(frozen=True)
class Prompt:
    """The prompt of a generation, checked: ids `[batch pos]`, left-padded, with the mask of
    real tokens (ones where nothing is padded), and whether it came as text."""

    tokens: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    text_in: bool

    @property
    def padded(self) -> bool:
        """Whether some row starts with padding."""
        return not bool(self.attention_mask.all())


def prompt_of(
    model: Any, input: Any, attention_mask: Tensor | None, prepend_bos: bool | None
) -> Prompt:
    """`input` (a string, a list of strings, or ids `[batch pos]` / `[pos]` with their
    `attention_mask`) as a checked `Prompt`: text tokenized and left-padded, ids checked
    against the model, the mask against the ids (left padding only: each row's last
    position is the token to continue)."""
    text_in = _tokenization.is_text(input)
    if text_in:
        if attention_mask is not None:
            raise TypeError("strings bring their own attention mask; do not pass one")
        batch = _tokenization.tokenize(model, input, prepend_bos, padding_side="left")
        input, attention_mask = batch.tokens, batch.attention_mask
    tokens = model._as_tokens(input)
    n_rows, n_prompt = tokens.shape
    if n_prompt == 0:
        raise ValueError("the prompt is empty: give at least one token to continue")
    if attention_mask is None:
        return Prompt(tokens, torch.ones_like(tokens), text_in)
    if tuple(attention_mask.shape) != (n_rows, n_prompt):
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)} but the tokens are "
            f"{(n_rows, n_prompt)}"
        )
    attention_mask = attention_mask.to(device=tokens.device, dtype=torch.long)
    if bool((attention_mask[:, -1] == 0).any()):
        rows = (attention_mask[:, -1] == 0).nonzero().flatten().tolist()
        raise ValueError(
            f"rows {rows} end in padding: generation needs left padding, so that each row's "
            f"last position is the token to continue (to_tokens(..., padding_side='left'))"
        )
    return Prompt(tokens, attention_mask, text_in)
