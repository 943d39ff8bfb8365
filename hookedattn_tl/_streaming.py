"""TransformerLens's `generate_stream(input, max_new_tokens, max_tokens_per_yield, ...)`.

The core's `generate_stream` with TL's signature and defaults: sampling by default, the
model's `default_prepend_bos`, `verbose` (TL's progress bar) accepted and ignored. Where TL
yields token chunks even for a text prompt (its `return_type` is read but never applied),
a text prompt streams text here, as `generate` returns it; pass `return_type="tokens"` for
TL's chunks.
"""

from collections.abc import Iterator
from typing import Any

from hookedattn.core.generation import generate_stream as _core_stream


def generate_stream(
    model: Any,
    input: Any = "",
    max_new_tokens: int = 10,
    max_tokens_per_yield: int = 25,
    stop_at_eos: bool = True,
    eos_token_id: int | None = None,
    do_sample: bool = True,
    top_k: int | None = None,
    top_p: float | None = None,
    temperature: float = 1.0,
    freq_penalty: float = 0.0,
    use_past_kv_cache: bool = True,
    prepend_bos: bool | None = None,
    padding_side: str | None = None,
    return_type: str | None = "input",
    verbose: bool = True,
    **kwargs: Any,
) -> Iterator[Any]:
    """TL's `generate_stream`: token chunks (the first with the prompt), or text for a text
    prompt, joined equal to `generate`'s output (`freq_penalty` with sampling, as there).
    Keyword arguments of the core's `generate_stream` (`seed`, `stop_strings`,
    `attention_mask`, ...) pass through."""
    yield from _core_stream(
        model,
        input,
        max_new_tokens,
        max_tokens_per_yield,
        stop_at_eos=stop_at_eos,
        eos_token_id=eos_token_id,
        do_sample=do_sample,
        top_k=top_k,
        top_p=top_p,
        temperature=temperature,
        freq_penalty=freq_penalty if do_sample else 0.0,
        use_past_kv_cache=use_past_kv_cache,
        prepend_bos=model._prepend_bos(prepend_bos),
        return_type=return_type or "input",
        **kwargs,
    )
