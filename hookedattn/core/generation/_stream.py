"""`generate_stream`: generation yielding its tokens, or its text, as they are produced.

TransformerLens's `generate_stream` yields token chunks: the first holds the prompt and the
first new tokens, each later one the next new tokens, at most `max_tokens_per_yield` at a
time, so that `torch.cat(chunks, dim=1)` is what `generate` returns. Text streams the same
way: the first chunk is the prompt's text and the first new text, and `"".join(chunks)` is
`generate`'s text. A chunk of text never ends inside a character: a byte tokenizer's
partial UTF-8 sequence (decoded as U+FFFD) waits for the tokens that complete it.
"""

from collections.abc import Iterator
from typing import Any

import torch
from torch import Tensor

from hookedattn.core.generation._entry import check_return_type, output_of
from hookedattn.core.generation._loop import Generated, generation_steps
from hookedattn.core.generation._options import options_of, prompt_of, with_options

_INCOMPLETE = "\ufffd"


@with_options
def generate_stream(
    model: Any,
    input: Any = "",
    max_new_tokens: Any = 10,
    max_tokens_per_yield: int = 25,
    *,
    attention_mask: Tensor | None = None,
    return_type: str = "input",
    **options: Any,
) -> Iterator[Any]:
    """Generate as `generate` does (the same options), yielding the output as it grows:
    token chunks `[batch n]` (the first with the prompt in front), or text (a string for a
    string prompt, one per row for a list), every `max_tokens_per_yield` new tokens and
    when generation ends. Joined, the chunks are `generate`'s output (module docstring)."""
    check_return_type(return_type)
    if not isinstance(max_tokens_per_yield, int) or max_tokens_per_yield < 1:
        raise ValueError(f"max_tokens_per_yield must be an int >= 1, got {max_tokens_per_yield!r}")
    opts = options_of(max_new_tokens, options)
    prompt = prompt_of(model, input, attention_mask, opts.prepend_bos)
    as_text = return_type == "str" or (return_type == "input" and prompt.text_in)
    chunks = _TextChunks(model, input) if as_text else _TokenChunks()
    start = Generated.from_steps(prompt, [])
    new_tokens, new_mask, yielded = [], [], False
    for step in generation_steps(model, prompt, opts):
        new_tokens.append(step.tokens[:, None])
        new_mask.append(step.real.long()[:, None])
        if len(new_tokens) % max_tokens_per_yield == 0:
            yield chunks.next(start, new_tokens, new_mask, final=False)
            yielded = True
    last = chunks.next(start, new_tokens, new_mask, final=True)
    if not yielded or _holds_something(last):  # what is left: tokens, or held-back text
        yield last


def _holds_something(chunk: Any) -> bool:
    if isinstance(chunk, Tensor):
        return chunk.shape[1] > 0
    return any(chunk) if isinstance(chunk, list) else bool(chunk)


class _TokenChunks:
    """Token chunks: the new tokens since the last chunk, the prompt before the first."""

    def __init__(self) -> None:
        self.sent = None  # how many new tokens the chunks so far hold

    def next(self, prompt: Generated, new_tokens: list, new_mask: list, final: bool) -> Tensor:
        start, self.sent = self.sent, len(new_tokens)
        if start is None:
            return torch.cat([prompt.tokens, *new_tokens], dim=1)
        fresh = new_tokens[start:]
        return torch.cat(fresh, dim=1) if fresh else prompt.tokens[:, :0]


class _TextChunks:
    """Text chunks: each row's text since the last chunk (the prompt's in the first)."""

    def __init__(self, model: Any, input: Any) -> None:
        self.model, self.one = model, isinstance(input, str)
        self.sent: list[str] | None = None

    def next(self, prompt: Generated, new_tokens: list, new_mask: list, final: bool) -> Any:
        out = Generated(
            torch.cat([prompt.tokens, *new_tokens], dim=1),
            torch.cat([prompt.attention_mask, *new_mask], dim=1),
            len(new_tokens),
        )
        texts = output_of(self.model, out, [""] * out.tokens.shape[0], True, "str")
        sent = self.sent or [""] * len(texts)
        fresh = []
        for row, text in enumerate(texts):
            # What was sent is a prefix of the text so far (a byte tokenizer's decoding of
            # a prefix is a prefix); a partial character at the end waits.
            ready = text if final else text.rstrip(_INCOMPLETE)
            fresh.append(ready[len(sent[row]) :])
            sent[row] = sent[row] + fresh[-1]
        self.sent = sent
        return fresh[0] if self.one else fresh
