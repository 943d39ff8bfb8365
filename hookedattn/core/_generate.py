"""`HookedTransformer.generate` and `generate_steps`: text or token prompts in, text or tokens
out, around the generation loop (`_generation.generation_steps`).

Generation as an experiment: `generate_steps` yields every step with the activations of its
forward (`names_filter`), and stops when the loop over it does; `generate(...,
return_cache=True)` returns one cache over prompt and generated positions
(`_generation_cache`).
"""

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from hookedattn.core import _tokenization
from hookedattn.core._generation import Generated, GenerationStep, generation_steps
from hookedattn.core._generation_cache import NamesFilter, StepRecorder, assembled
from hookedattn.core._sampling import Sampling
from hookedattn.core._stopping import stop_rule
from hookedattn.core.cache import ActivationCache


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


@dataclasses.dataclass(frozen=True)
class _Request:
    """`generate`'s arguments, checked: the prompt's ids and mask, and how to run."""

    tokens: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"] | None
    text_in: bool
    options: dict[str, Any]


def request(
    model: Any,
    input: Any,
    max_new_tokens: Any,
    *,
    do_sample: bool,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    stop_at_eos: bool,
    eos_token_id: int | Sequence[int] | None,
    stop_strings: str | Sequence[str] | None,
    use_past_kv_cache: bool,
    prepend_bos: bool | None,
    attention_mask: Tensor | None,
    generator: torch.Generator | None,
    seed: int | Sequence[int] | None,
) -> _Request:
    """The prompt of `generate`'s input (text left-padded) and `generation_steps`' options."""
    sampling = Sampling(do_sample, temperature, top_k, top_p)
    text_in = _tokenization.is_text(input)
    tokens, attention_mask = _prompt(model, input, text_in, attention_mask, prepend_bos)
    tokens = model._as_tokens(tokens)
    tokenizer = _tokenization.tokenizer_of(model) if model.tokenizer is not None else None
    stop = stop_rule(
        tokenizer,
        stop_at_eos=stop_at_eos,
        eos_token_id=eos_token_id,
        stop_strings=stop_strings,
        device=tokens.device,
    )
    options = dict(
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        use_past_kv_cache=use_past_kv_cache,
        stop=stop,
        generator=generator,
        seed=seed,
    )
    return _Request(tokens, attention_mask, text_in, options)


def check_return_type(return_type: str) -> None:
    """Refuse a `return_type` that `generate` and `generate_stream` do not know."""
    if return_type not in ("input", "str", "tokens"):
        raise ValueError(f"return_type must be 'input', 'str' or 'tokens', got {return_type!r}")


def generate(
    model: Any,
    input: Any = "",
    max_new_tokens: Any = 10,
    *,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_at_eos: bool = True,
    eos_token_id: int | Sequence[int] | None = None,
    stop_strings: str | Sequence[str] | None = None,
    use_past_kv_cache: bool = True,
    prepend_bos: bool | None = None,
    attention_mask: Tensor | None = None,
    return_type: str = "input",
    generator: torch.Generator | None = None,
    seed: int | Sequence[int] | None = None,
    return_cache: bool = False,
    names_filter: NamesFilter = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> Any:
    """Continue a prompt token by token, with a KV cache; `HookedTransformer.generate`.

    `input` is a string, a list of strings (left-padded) or token ids `[batch pos]` (with
    their `attention_mask`, left-padded). `max_new_tokens` is an int or one per row. Greedy
    unless `do_sample` (TransformerLens samples by default); sampling divides the logits by
    `temperature`, keeps the `top_k` most likely tokens, then those whose probability
    reaches `top_p`, drawing from `generator`, or with `seed` (an int, or one per row) from
    one generator per row: a row then gets the same tokens whatever batch it is in. A row
    ends at `eos_token_id` (an id or a set of them; by default the tokenizer's EOS) with
    `stop_at_eos`, once its generated text contains one of `stop_strings`, or after its own
    `max_new_tokens`. `return_type`: "input" (text for text, tokens for tokens), "str" or
    "tokens". Hooks attached to the model run at every step.

    With `return_cache=True` it returns a `GenerationWithCache`: the output, the tokens
    and their mask, and one `ActivationCache` over prompt and generated positions, recorded
    at each step (`names_filter`, `device`, `dtype` as in `run_with_cache`), equal to
    `run_with_cache` of the final tokens.
    """
    check_return_type(return_type)
    req = request(
        model,
        input,
        max_new_tokens,
        do_sample=do_sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        stop_at_eos=stop_at_eos,
        eos_token_id=eos_token_id,
        stop_strings=stop_strings,
        use_past_kv_cache=use_past_kv_cache,
        prepend_bos=prepend_bos,
        attention_mask=attention_mask,
        generator=generator,
        seed=seed,
    )
    if return_cache:
        recorder = StepRecorder(model, names_filter, device, dtype, keep=True)
        return _with_cache(model, req, recorder, input, return_type, use_past_kv_cache)
    steps = generation_steps(model, req.tokens, req.attention_mask, **req.options)
    out = Generated.from_steps(model, req.tokens, req.attention_mask, steps)
    return output_of(model, out, input, req.text_in, return_type)


def _with_cache(
    model: Any, req: _Request, recorder: StepRecorder, input: Any, return_type: str, kv: bool
) -> GenerationWithCache:
    """`generate(..., return_cache=True)`: the generation, recording every step."""
    steps = generation_steps(
        model, req.tokens, req.attention_mask, **req.options, recorder=recorder, record_last=True
    )
    with recorder.attached():  # once for every step: no caller runs between them
        out = Generated.from_steps(model, req.tokens, req.attention_mask, steps)
    # Without a KV cache every forward ran the whole sequence: the last one holds it all.
    stores = recorder.stores if kv else recorder.stores[-1:]
    cache = assembled(stores, model.cfg.n_layers)
    output = output_of(model, out, input, req.text_in, return_type)
    return GenerationWithCache(output, out.tokens, out.attention_mask, cache)


def output_of(model: Any, out: Generated, input: Any, text_in: bool, return_type: str) -> Any:
    """What `generate` returns for `out`: tokens, or the text of each row's real tokens."""
    if return_type == "tokens" or (return_type == "input" and not text_in):
        return out.tokens
    texts = [
        _tokenization.tokenizer_of(model).decode(
            row[keep.bool()].tolist(), skip_special_tokens=True
        )
        for row, keep in zip(out.tokens, out.attention_mask, strict=True)
    ]
    return texts[0] if isinstance(input, str) else texts


def generate_steps(
    model: Any,
    input: Any = "",
    max_new_tokens: Any = 10,
    *,
    names_filter: NamesFilter = None,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    stop_at_eos: bool = True,
    eos_token_id: int | Sequence[int] | None = None,
    stop_strings: str | Sequence[str] | None = None,
    use_past_kv_cache: bool = True,
    prepend_bos: bool | None = None,
    attention_mask: Tensor | None = None,
    generator: torch.Generator | None = None,
    seed: int | Sequence[int] | None = None,
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
    req = request(
        model,
        input,
        max_new_tokens,
        do_sample=do_sample,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        stop_at_eos=stop_at_eos,
        eos_token_id=eos_token_id,
        stop_strings=stop_strings,
        use_past_kv_cache=use_past_kv_cache,
        prepend_bos=prepend_bos,
        attention_mask=attention_mask,
        generator=generator,
        seed=seed,
    )
    recorder = StepRecorder(model, names_filter, device, dtype)
    yield from generation_steps(
        model, req.tokens, req.attention_mask, **req.options, recorder=recorder
    )


def _prompt(
    model: Any, input: Any, text_in: bool, attention_mask: Tensor | None, prepend_bos: Any
) -> tuple[Any, Tensor | None]:
    """The prompt's ids and mask: text tokenized and left-padded, ids as given."""
    if not text_in:
        return input, attention_mask
    if attention_mask is not None:
        raise TypeError("strings bring their own attention mask; do not pass one")
    batch = _tokenization.tokenize(model, input, prepend_bos, padding_side="left")
    return batch.tokens, batch.attention_mask
