"""Generating text: one token at a time, each step reading the keys and values of the
positions before it from a `KeyValueCache` instead of running them again.

The parallel forward and this sequential loop compute the same numbers: position `i` only
reads keys and values of positions `<= i` (the causal mask), so the logits that the KV-cache
step computes for position `i` are the logits a full forward gives at `i`. What runs in
parallel is every position of one forward; what runs in sequence is only the choice of the
next token, which needs the logits of the one before.

Batches are left-padded (as in TransformerLens), so that the last position of every row is
a real token whose logits choose the next one. A sequence that has produced EOS (with
`stop_at_eos`) is continued with padding, masked out in the returned `attention_mask`.
Hooks attached to the model (`with model.hooks(...)`) run at every step.
"""

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from hookedattn.core import _tokenization
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.kv_cache import KeyValueCache


@dataclasses.dataclass(frozen=True)
class Sampling:
    """How the next token is chosen from the logits.

    Greedy (the most likely token, the first on ties) unless `do_sample`; sampling divides
    the logits by `temperature` (0 means greedy), keeps the `top_k` most likely tokens,
    then the smallest set of most likely tokens whose probability reaches `top_p`.
    """

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None

    def __post_init__(self) -> None:
        # `not (low <= x)` rather than `x < low`: NaN compares false with everything.
        if not _is_number(self.temperature) or not 0 <= self.temperature < math.inf:
            raise ValueError(
                f"temperature must be a number >= 0 and finite (0 is greedy), got "
                f"{self.temperature!r}"
            )
        if self.top_k is not None and (
            not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 1
        ):
            raise ValueError(f"top_k must be an int >= 1 or None, got {self.top_k!r}")
        if self.top_p is not None and not (_is_number(self.top_p) and 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] (a number) or None, got {self.top_p!r}")

    @property
    def greedy(self) -> bool:
        """Whether the next token is the argmax of the logits."""
        return not self.do_sample or self.temperature == 0


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def next_token_probs(
    logits: Float[Tensor, "batch d_vocab_out"], sampling: Sampling
) -> Float[Tensor, "batch d_vocab_out"]:
    """The distribution a sampling step draws from: temperature, then top-k, then top-p."""
    scaled = logits / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < scaled.shape[-1]:
        kth = scaled.topk(sampling.top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, -torch.inf)
    probs = scaled.softmax(dim=-1)
    if sampling.top_p is not None:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep a token when the tokens more likely than it do not yet reach top_p: the
        # smallest prefix whose mass reaches top_p, never empty.
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        keep_sorted = mass_before < sampling.top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = probs.masked_fill(~keep, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def choose_next_tokens(
    logits: Float[Tensor, "batch d_vocab_out"],
    sampling: Sampling,
    generator: torch.Generator | None = None,
) -> Int[Tensor, " batch"]:
    """The next token of each sequence: the argmax, or a draw from `next_token_probs`."""
    if sampling.greedy:
        return logits.argmax(dim=-1)
    probs = next_token_probs(logits.to(torch.float64), sampling)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]


@dataclasses.dataclass(frozen=True)
class GenerationStep:
    """One step of generation: the tokens chosen, the logits they were chosen from, and
    which sequences have produced EOS by now."""

    tokens: Int[Tensor, " batch"]
    logits: Float[Tensor, "batch d_vocab_out"]
    finished: Bool[Tensor, " batch"]

    def __repr__(self) -> str:
        return f"GenerationStep(tokens={self.tokens.tolist()}, finished={self.finished.tolist()})"


@dataclasses.dataclass(frozen=True)
class Generated:
    """Prompt and generated tokens `[batch pos]`, with the mask of real tokens."""

    tokens: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    n_new: int

    def __repr__(self) -> str:
        batch, pos = self.tokens.shape
        return f"Generated(batch={batch}, pos={pos}, n_new={self.n_new})"

    @classmethod
    def from_steps(
        cls, model: Any, tokens: Tensor, attention_mask: Tensor | None, steps: Iterable
    ) -> "Generated":
        """The prompt and the tokens of `steps` (`generation_steps` of that prompt, run to
        the end here), with their mask: a token is real up to and including the EOS that
        finishes its sequence."""
        tokens, mask = _checked_prompt(model, tokens, attention_mask)
        new_tokens, new_mask = [], []
        alive = torch.ones_like(mask[:, 0])
        for step in steps:
            new_tokens.append(step.tokens[:, None])
            new_mask.append(alive[:, None])
            alive = (~step.finished).long()
        return cls(
            torch.cat([tokens, *new_tokens], dim=1),
            torch.cat([mask, *new_mask], dim=1),
            len(new_tokens),
        )


def _checked_prompt(
    model: Any, tokens: Tensor, attention_mask: Tensor | None
) -> tuple[Int[Tensor, "batch pos"], Int[Tensor, "batch pos"]]:
    tokens = model._as_tokens(tokens)
    batch, n_prompt = tokens.shape
    if n_prompt == 0:
        raise ValueError("the prompt is empty: give at least one token to continue")
    if attention_mask is None:
        return tokens, torch.ones_like(tokens)
    if tuple(attention_mask.shape) != (batch, n_prompt):
        raise ValueError(
            f"attention_mask has shape {tuple(attention_mask.shape)} but the tokens are "
            f"{(batch, n_prompt)}"
        )
    attention_mask = attention_mask.to(device=tokens.device, dtype=torch.long)
    if bool((attention_mask[:, -1] == 0).any()):
        rows = (attention_mask[:, -1] == 0).nonzero().flatten().tolist()
        raise ValueError(
            f"rows {rows} end in padding: generation needs left padding, so that each row's "
            f"last position is the token to continue (to_tokens(..., padding_side='left'))"
        )
    return tokens, attention_mask


def _check_length(cfg: Any, n_prompt: int, max_new_tokens: Any) -> None:
    if not isinstance(max_new_tokens, int) or isinstance(max_new_tokens, bool):
        raise TypeError(f"max_new_tokens must be an int, got {max_new_tokens!r}")
    if max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if n_prompt + max_new_tokens > cfg.n_ctx:
        raise ValueError(
            f"a prompt of {n_prompt} positions plus max_new_tokens={max_new_tokens} exceeds "
            f"the model's n_ctx={cfg.n_ctx}; at most {cfg.n_ctx - n_prompt} new "
            f"tokens fit after this prompt"
        )


@torch.no_grad()
def generation_steps(
    model: Any,
    tokens: Tensor,
    attention_mask: Tensor | None = None,
    *,
    max_new_tokens: Any,
    sampling: Sampling = Sampling(),
    use_past_kv_cache: bool = True,
    stop_at_eos: bool = False,
    eos_token_ids: Sequence[int] = (),
    pad_token_id: int = 0,
    generator: torch.Generator | None = None,
) -> Iterator[GenerationStep]:
    """Generate step by step, yielding each step's choice and logits.

    With `use_past_kv_cache` the prompt runs once and every later step runs only the new
    token against the cache; without, every step runs the whole sequence again. Both give
    the same logits (the tests check it). With `stop_at_eos`, a sequence that has produced
    one of `eos_token_ids` continues with `pad_token_id` (masked out), and the loop ends
    when every sequence has. Meanwhile each layer keeps its fused q/k/v weights
    (`keeping_fused_weights`: one token's product is as cheap as laying them out).
    """
    tokens, mask = _checked_prompt(model, tokens, attention_mask)
    _check_length(model.cfg, tokens.shape[1], max_new_tokens)
    eos = torch.tensor(list(eos_token_ids), dtype=torch.long, device=tokens.device)
    stop = _Stop(eos, pad_token_id) if stop_at_eos else None
    cache = KeyValueCache.empty(model.cfg, tokens.shape[0]) if use_past_kv_cache else None

    def choose(logits: Float[Tensor, "batch d_vocab_out"]) -> Int[Tensor, " batch"]:
        return choose_next_tokens(logits, sampling, generator)

    with model.keeping_fused_weights():
        yield from _steps(model, tokens, mask, cache, max_new_tokens, choose, stop)


@dataclasses.dataclass(frozen=True)
class _Stop:
    """A sequence ends at one of the ids `eos`, and continues with `pad`, masked out."""

    eos: Int[Tensor, " n_eos"]
    pad: int


def _steps(
    model: Any,
    tokens: Int[Tensor, "batch pos"],
    mask: Int[Tensor, "batch pos"],
    cache: KeyValueCache | None,
    max_new_tokens: int,
    choose: Callable[[Tensor], Tensor],
    stop: _Stop | None,
) -> Iterator[GenerationStep]:
    """`generation_steps` after its checks."""
    finished = torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    # Without padding the forward takes no mask: it then skips the padding checks and
    # per-row positions, a third of the torch calls of a one-token step.
    padded = not bool(mask.all())
    new_tokens, new_mask = tokens, mask
    for _ in range(max_new_tokens):
        if cache is None:
            logits = _last_logits(model, tokens, mask if padded else None, None)
        elif padded or cache.length == 0:
            logits = _last_logits(model, new_tokens, new_mask if padded else None, cache)
        else:  # one chosen token per row after real tokens only: no input to check
            logits = model._next_token_step(new_tokens, cache)
        chosen = choose(logits)
        if stop is not None:  # a finished sequence continues with padding, masked out
            chosen = torch.where(finished, torch.full_like(chosen, stop.pad), chosen)
            padded = padded or bool(finished.any())
        new_tokens = chosen[:, None]
        if padded or cache is None:
            new_mask = (~finished).long()[:, None]
        if cache is None:  # with a KV cache, the next step reads only the new token
            tokens = torch.cat([tokens, new_tokens], dim=1)
            mask = torch.cat([mask, new_mask], dim=1)
        if stop is not None:
            finished = finished | torch.isin(chosen, stop.eos)
        yield GenerationStep(chosen, logits, finished)
        if stop is not None and bool(finished.all()):
            return


def _last_logits(
    model: Any, tokens: Tensor, attention_mask: Tensor | None, cache: KeyValueCache | None
) -> Float[Tensor, "batch d_vocab_out"]:
    """The logits of each row's last position, the one the next token is chosen from.

    Where no hook reads the final norm or the unembedding, only that position goes through
    them (a prompt of 16 tokens would otherwise pay 16 unembeddings for one); where one
    does, every position does, so that the hook sees the whole forward.
    """
    if _hooked(model.ln_final) or _hooked(model.unembed):
        return model(tokens, attention_mask=attention_mask, past_kv_cache=cache)[:, -1]
    n_layers = model.cfg.n_layers
    resid = model(
        tokens, attention_mask=attention_mask, past_kv_cache=cache, stop_at_layer=n_layers
    )
    return model.unembed(model.ln_final(resid[:, -1:]))[:, -1]


def _hooked(module: torch.nn.Module) -> bool:
    """Whether a hook point in `module` has a hook attached."""
    return any(isinstance(m, HookPoint) and m.has_hooks() for m in module.modules())


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
    use_past_kv_cache: bool = True,
    prepend_bos: bool | None = None,
    attention_mask: Tensor | None = None,
    return_type: str = "input",
    generator: torch.Generator | None = None,
) -> Any:
    """Continue a prompt token by token, with a KV cache; `HookedTransformer.generate`.

    `input` is a string, a list of strings (left-padded) or token ids `[batch pos]` (with
    their `attention_mask`, left-padded). Greedy unless `do_sample` (TransformerLens samples
    by default); sampling divides the logits by `temperature`, keeps the `top_k` most
    likely tokens, then those whose probability reaches `top_p` (`Sampling`), drawing from
    `generator` if given. With `stop_at_eos` a sequence ends at `eos_token_id` (by default
    the tokenizer's). `return_type`: "input" (text for text, tokens for tokens), "str" or
    "tokens". Hooks attached to the model run at every step.
    """
    if return_type not in ("input", "str", "tokens"):
        raise ValueError(f"return_type must be 'input', 'str' or 'tokens', got {return_type!r}")
    sampling = Sampling(do_sample, temperature, top_k, top_p)
    text_in = _tokenization.is_text(input)
    tokens, attention_mask = _prompt(model, input, text_in, attention_mask, prepend_bos)
    tokenizer = _tokenization.tokenizer_of(model) if model.tokenizer is not None else None
    eos = _eos_ids(eos_token_id, tokenizer, stop_at_eos)
    pad = tokenizer.padding_id() if tokenizer is not None else (eos[0] if eos else 0)
    steps = generation_steps(
        model,
        tokens,
        attention_mask,
        max_new_tokens=max_new_tokens,
        sampling=sampling,
        use_past_kv_cache=use_past_kv_cache,
        stop_at_eos=stop_at_eos,
        eos_token_ids=eos,
        pad_token_id=pad,
        generator=generator,
    )
    out = Generated.from_steps(model, tokens, attention_mask, steps)
    if return_type == "tokens" or (return_type == "input" and not text_in):
        return out.tokens
    texts = [
        _tokenization.tokenizer_of(model).decode(
            row[keep.bool()].tolist(), skip_special_tokens=True
        )
        for row, keep in zip(out.tokens, out.attention_mask, strict=True)
    ]
    return texts[0] if isinstance(input, str) else texts


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


def _eos_ids(eos_token_id: Any, tokenizer: Any, stop_at_eos: bool) -> list[int]:
    if eos_token_id is None:
        eos_token_id = None if tokenizer is None else tokenizer.eos_token_id
    if eos_token_id is None:
        if stop_at_eos:
            raise ValueError(
                "stop_at_eos=True needs an end-of-sequence token, and this model's tokenizer "
                "has none: pass eos_token_id=, or stop_at_eos=False"
            )
        return []
    return [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
