"""`HookedTransformer.generate` and `generate_steps`: text or token prompts in, text or tokens
out, around the one generation loop (`_loop.generation_steps`).

Generation as an experiment: `generate_steps` yields every step with the activations of its
forward (`names_filter`), and stops when the loop over it does; `generate(...,
return_cache=True)` returns one cache over prompt and generated positions (`_recording`).
"""

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from hookedattn.core import _tokenization
from hookedattn.core.cache import ActivationCache
from hookedattn.core.generation._loop import Generated, GenerationStep, generation_steps
from hookedattn.core.generation._options import options_of, prompt_of, with_options
from hookedattn.core.generation._recording import NamesFilter, StepRecorder, assembled

RETURN_TYPES = ("input", "str", "tokens")


@dataclasses.dataclass(frozen=True)
class GenerationWithCache:
    """What `generate(..., return_cache=True)` returns: the `output` generate returns
    otherwise (text or tokens), the prompt and generated `tokens` with their
    `attention_mask` (0 at padding), and the activations over all of them: `cache[name]`
    equals `run_with_cache(tokens, attention_mask=attention_mask)[1][name]`."""

    output: Any
    tokens: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    cache: ActivationCache

    def __repr__(self) -> str:
        batch, pos = self.tokens.shape
        return f"GenerationWithCache(batch={batch}, pos={pos}, cache={len(self.cache)} names)"


def check_return_type(return_type: Any) -> None:
    """Refuse a `return_type` that `generate` and `generate_stream` do not know."""
    if return_type not in RETURN_TYPES:
        raise ValueError(f"return_type must be 'input', 'str' or 'tokens', got {return_type!r}")


@with_options
def generate(
    model: Any,
    input: Any = "",
    max_new_tokens: Any = 10,
    *,
    attention_mask: Tensor | None = None,
    return_type: str = "input",
    return_cache: bool = False,
    names_filter: NamesFilter = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    **options: Any,
) -> Any:
    """Continue a prompt token by token, with a KV cache; `HookedTransformer.generate`.

    `input` is a string, a list of strings (left-padded) or token ids `[batch pos]` (with
    their `attention_mask`, left-padded). `max_new_tokens` is an int or one per row. The
    other keywords are `GenerationOptions`' (greedy unless `do_sample`; TransformerLens
    samples by default): how each token is chosen, when a row ends. `return_type`: "input"
    (text for text, tokens for tokens), "str" or "tokens". Hooks attached to the model run
    at every step.

    With `return_cache=True` it returns a `GenerationWithCache`: the output, the tokens
    and their mask, and one `ActivationCache` over prompt and generated positions, recorded
    at each step (`names_filter`, `device`, `dtype` as in `run_with_cache`), equal to
    `run_with_cache` of the final tokens.
    """
    check_return_type(return_type)
    opts = options_of(max_new_tokens, options)
    prompt = prompt_of(model, input, attention_mask, opts.prepend_bos)
    if not return_cache:
        out = Generated.from_steps(prompt, generation_steps(model, prompt, opts))
        return output_of(model, out, input, prompt.text_in, return_type)
    # Handed over only at the end: what exists only written out is read after the last step.
    defers = opts.use_past_kv_cache
    recorder = StepRecorder(model, names_filter, device, dtype, keep=True, defers=defers)
    steps = generation_steps(model, prompt, opts, recorder, record_last=True)
    with recorder.attached():  # once for every step: no caller runs between them
        out = Generated.from_steps(prompt, steps)
    # Without a KV cache every forward ran the whole sequence: the last one holds it all.
    stores = recorder.stores if opts.use_past_kv_cache else recorder.stores[-1:]
    cache = assembled(stores, model.cfg.n_layers)
    output = output_of(model, out, input, prompt.text_in, return_type)
    return GenerationWithCache(output, out.tokens, out.attention_mask, cache)


@with_options
def generate_steps(
    model: Any,
    input: Any = "",
    max_new_tokens: Any = 10,
    *,
    attention_mask: Tensor | None = None,
    names_filter: NamesFilter = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    **options: Any,
) -> Iterator[GenerationStep]:
    """Generate as `generate` does, yielding every step as it is made: `step.tokens` (the
    token chosen for each row), `step.logits`, `step.finished`, and `step.cache`, the
    activations at `names_filter` (None: every hook point) of the forward that computed the
    logits: the prompt's positions at the first step, then one position per row (the token
    chosen at the step before). Stop the loop to stop generating (a `break`, or closing
    the iterator). The recording hooks are attached only while a step is made: a forward
    of your own between steps is not recorded, and hooks you attach between steps act
    from the next step on.
    """
    opts = options_of(max_new_tokens, options)
    prompt = prompt_of(model, input, attention_mask, opts.prepend_bos)
    recorder = StepRecorder(model, names_filter, device, dtype)
    yield from generation_steps(model, prompt, opts, recorder)


def output_of(model: Any, out: Generated, input: Any, text_in: bool, return_type: str) -> Any:
    """What `generate` returns for `out`: tokens, or the text of each row's real tokens."""
    if return_type == "tokens" or (return_type == "input" and not text_in):
        return out.tokens
    tokenizer = _tokenization.tokenizer_of(model)
    texts = [
        tokenizer.decode(row[keep.bool()].tolist(), skip_special_tokens=True)
        for row, keep in zip(out.tokens, out.attention_mask, strict=True)
    ]
    return texts[0] if isinstance(input, str) else texts
