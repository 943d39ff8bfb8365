"""Generating text: one token at a time, each step reading the keys and values of the
positions before it from a `KeyValueCache` instead of running them again.

The parallel forward and this sequential loop compute the same numbers: position `i` only
reads keys and values of positions `<= i` (the causal mask), so the logits that the KV-cache
step computes for position `i` are the logits a full forward gives at `i`. What runs in
parallel is every position of one forward; what runs in sequence is only the choice of the
next token, which needs the logits of the one before.

Batches are left-padded (as in TransformerLens), so that the last position of every row is
a real token whose logits choose the next one. A row that has ended (`_stopping`: a stop
token, a stop string, its own `max_new_tokens`) is continued with padding, masked out in the
returned `attention_mask`. Hooks attached to the model (`with model.hooks(...)`) run at every
step; with none attached, a step takes the fast decode path (`_decode`), to the same numbers.

This module is the loop (`generation_steps`); `_generate` reads `generate`'s arguments and
builds its output, `_streaming` streams it.
"""

import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from hookedattn.core._generation_cache import StepRecorder, step_cache
from hookedattn.core._sampling import (
    RowSampler,
    Sampling,
    choose_next_tokens,
    next_token_probs,
)
from hookedattn.core._stopping import StopRule
from hookedattn.core.cache import ActivationCache
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.kv_cache import KeyValueCache

# Re-exported: the TransformerLens facade and the tests read them here.
__all__ = ["Sampling", "choose_next_tokens", "next_token_probs"]

GREEDY = Sampling()


@dataclasses.dataclass(frozen=True)
class GenerationPosition:
    """Where the forward in progress is in a generation: `offset` is the position (in the
    stored sequence, left padding included) of its first token, `n_prompt` the length of
    the prompt. A hook reads it with `generation_position()` to tell prompt positions
    (`< n_prompt`) from generated ones."""

    offset: int
    n_prompt: int


_POSITION: contextvars.ContextVar[GenerationPosition | None] = contextvars.ContextVar(
    "generation_position", default=None
)


def generation_position() -> GenerationPosition | None:
    """The `GenerationPosition` of the forward in progress, if generation runs it; None
    for any other forward (whose positions start at 0, unless it continues a KV cache of
    your own). A hook called during `generate` reads where its activation is: positions
    `offset .. offset + pos - 1` of the sequence."""
    return _POSITION.get()


@dataclasses.dataclass(frozen=True)
class GenerationStep:
    """One step of generation: the token chosen for each row and the logits it was chosen
    from; which rows have ended (this token included), and whether this token is a real one
    of its row (False: padding after the row ended). `cache` holds the activations of the
    forward that computed these logits (the prompt's positions at step 0, then the previous
    token's), where the steps were asked to record them."""

    tokens: Int[Tensor, " batch"]
    logits: Float[Tensor, "batch d_vocab_out"]
    finished: Bool[Tensor, " batch"]
    real: Bool[Tensor, " batch"]
    cache: ActivationCache | None = None

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
        the end here), with their mask: a token is real up to and including the one that
        ends its row."""
        tokens, mask = _checked_prompt(model, tokens, attention_mask)
        new_tokens, real = [], []
        for step in steps:
            new_tokens.append(step.tokens)
            real.append(step.real)
        if not new_tokens:
            return cls(tokens, mask, 0)
        return cls(
            torch.cat([tokens, torch.stack(new_tokens, dim=1)], dim=1),
            torch.cat([mask, torch.stack(real, dim=1).long()], dim=1),
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


def _limits(max_new_tokens: Any) -> tuple[int, list[int] | None]:
    """The number of steps, and the per-row limits where `max_new_tokens` gives them."""
    if isinstance(max_new_tokens, Sequence) and not isinstance(max_new_tokens, str):
        for n in max_new_tokens:
            _check_count(n)
        return max(max_new_tokens, default=0), list(max_new_tokens)
    _check_count(max_new_tokens)
    return max_new_tokens, None


def _check_count(n: Any) -> None:
    if not isinstance(n, int) or isinstance(n, bool):
        raise TypeError(f"max_new_tokens must be an int or a list of ints, got {n!r}")
    if n < 0:
        raise ValueError(f"max_new_tokens must be >= 0, got {n}")


def _check_length(cfg: Any, n_prompt: int, n_steps: int) -> None:
    if n_prompt + n_steps > cfg.n_ctx:
        raise ValueError(
            f"a prompt of {n_prompt} positions plus max_new_tokens={n_steps} exceeds "
            f"the model's n_ctx={cfg.n_ctx}; at most {cfg.n_ctx - n_prompt} new "
            f"tokens fit after this prompt"
        )


def default_stop(device: torch.device) -> StopRule:
    """No stop token, string or per-row limit: every row runs all the steps."""
    return StopRule(torch.empty(0, dtype=torch.long, device=device), 0)


def generation_steps(
    model: Any,
    tokens: Tensor,
    attention_mask: Tensor | None = None,
    *,
    max_new_tokens: Any,
    sampling: Sampling = GREEDY,
    use_past_kv_cache: bool = True,
    stop: StopRule | None = None,
    generator: torch.Generator | None = None,
    seed: int | Sequence[int] | None = None,
    recorder: StepRecorder | None = None,
    record_last: bool = False,
) -> Iterator[GenerationStep]:
    """Generate step by step, yielding each step's choice and logits.

    With `use_past_kv_cache` the prompt runs once and every later step runs only the new
    token against the cache (the fast decode step where no hook is attached); without,
    every step runs the whole sequence again. Both give the same logits (the tests check
    it). `max_new_tokens` is an int, or one per row (a row past its own ends, as at a stop
    token: `stop`). Tokens are drawn from `generator`, or with `seed` from one generator per
    row (`RowSampler`). With a `recorder` attached, each step carries the activations of
    its forward; `record_last` runs one more forward over the last tokens chosen, so that
    the recorder holds every position (its logits are not a step). Meanwhile each layer
    keeps its fused q/k/v weights (`keeping_fused_weights`).
    """
    tokens, mask = _checked_prompt(model, tokens, attention_mask)
    n_steps, limits = _limits(max_new_tokens)
    _check_length(model.cfg, tokens.shape[1], n_steps)
    batch, device = tokens.shape[0], tokens.device
    stop = stop or default_stop(device)
    if limits is not None:
        if len(limits) != batch:
            raise ValueError(
                f"max_new_tokens has {len(limits)} entries but there are {batch} rows: give "
                f"one per row, or one int for all"
            )
        stop = dataclasses.replace(stop, limits=torch.tensor(limits, device=device))
    if seed is not None and generator is not None:
        raise ValueError("give seed= (one generator per row) or generator=, not both")
    choose = _chooser(sampling, generator, seed, batch)
    capacity = tokens.shape[1] + n_steps  # the last forward of `record_last` included
    cache = KeyValueCache.empty(model.cfg, batch, capacity=capacity) if use_past_kv_cache else None
    loop = _Loop(model, tokens, mask, cache, choose, stop, recorder)
    with model.keeping_fused_weights():
        yield from _stepwise(loop.steps(n_steps, record_last), recorder)


def _stepwise(steps: Iterator[GenerationStep], recorder: StepRecorder | None) -> Iterator:
    """`steps`, each one made without gradients and with the recording hooks attached, and
    neither while the caller holds a step: their own forwards between steps are theirs.
    (`@torch.no_grad()` on a generator does this, but not once a type checker wraps it.)"""
    try:
        while True:
            with torch.no_grad(), recorder.attached() if recorder else contextlib.nullcontext():
                step = next(steps, None)
            if step is None:
                return
            yield step
    finally:
        steps.close()


def _chooser(
    sampling: Sampling, generator: torch.Generator | None, seed: Any, batch: int
) -> Callable[[Tensor], Tensor]:
    if seed is not None:
        sampler = RowSampler.for_batch(seed, batch)
        return lambda logits: sampler.choose(logits, sampling)
    return lambda logits: choose_next_tokens(logits, sampling, generator)


class _Loop:
    """The state of one generation: the tokens so far (without a KV cache, every step runs
    them all), which rows are padded or ended, and how a step's forward runs."""

    def __init__(
        self,
        model: Any,
        tokens: Int[Tensor, "batch pos"],
        mask: Int[Tensor, "batch pos"],
        cache: KeyValueCache | None,
        choose: Callable[[Tensor], Tensor],
        stop: StopRule,
        recorder: StepRecorder | None,
    ) -> None:
        self.model, self.cache, self.choose, self.stop = model, cache, choose, stop
        self.recorder = recorder
        self.tokens, self.mask = tokens, mask
        self.new_tokens, self.new_mask = tokens, mask
        self.n_prompt = tokens.shape[1]
        # Without padding the forward takes no mask: it then skips the padding checks and
        # per-row positions, a third of the torch calls of a one-token step.
        self.padded = not bool(mask.all())

    def steps(self, n_steps: int, record_last: bool) -> Iterator[GenerationStep]:
        """`n_steps` steps (fewer if every row ends first), then the last forward if asked."""
        stop = self.stop
        ended = stop.ended_before_start(self.tokens.shape[0], self.tokens.device)
        real = ~ended  # without a stop rule, every token is real: one tensor for all steps
        for n_done in range(1, n_steps + 1):
            logits, cache = self.forward()
            chosen = self.choose(logits)
            if stop.pads:  # an ended row continues with padding, masked out
                real = ~ended
                chosen = torch.where(ended, torch.full_like(chosen, stop.pad), chosen)
                self.padded = self.padded or bool(ended.any())
                ended = stop.ended(chosen, ended, n_done)
            self.advance(chosen, real)
            yield GenerationStep(chosen, logits, ended, real, cache)
            if stop.pads and bool(ended.all()):
                break
        if record_last and self.recorder is not None:
            self.forward()

    def advance(self, chosen: Int[Tensor, " batch"], real: Bool[Tensor, " batch"]) -> None:
        """The next forward's input: the chosen tokens (with the KV cache, alone)."""
        self.new_tokens = chosen[:, None]
        if self.padded or self.cache is None:  # otherwise the forward takes no mask
            self.new_mask = real.long()[:, None]
        if self.cache is None:
            self.tokens = torch.cat([self.tokens, self.new_tokens], dim=1)
            self.mask = torch.cat([self.mask, self.new_mask], dim=1)

    def forward(self) -> tuple[Float[Tensor, "batch d_vocab_out"], ActivationCache | None]:
        """The logits of each row's last position, and the activations recorded."""
        offset = 0 if self.cache is None else self.cache.length
        position = _POSITION.set(GenerationPosition(offset, self.n_prompt))
        try:
            logits = self._logits()
        finally:
            _POSITION.reset(position)
        if self.recorder is None:
            return logits, None
        return logits, step_cache(self.recorder.take(), self.model.cfg.n_layers)

    def _logits(self) -> Float[Tensor, "batch d_vocab_out"]:
        model, cache, recorder = self.model, self.cache, self.recorder
        if recorder is not None:
            recorder.before_forward()
        if cache is None:
            logits = _last_logits(model, self.tokens, self.mask if self.padded else None, None)
        elif cache.length == 0:  # the prompt
            mask = self.new_mask if self.padded else None
            logits = _last_logits(model, self.new_tokens, mask, cache)
        elif self.padded:
            logits = model(self.new_tokens, attention_mask=self.new_mask, past_kv_cache=cache)
            logits = logits[:, -1]
        else:  # one more real token per row: the forward without its input checks
            logits = model._next_token_step(self.new_tokens, cache)
        return logits


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
