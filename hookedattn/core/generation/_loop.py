"""The generation loop: one token at a time, each step reading the keys and values of the
positions before it from a `KeyValueCache` instead of running them again.

The parallel forward and this sequential loop compute the same numbers: position `i` only
reads keys and values of positions `<= i` (the causal mask), so the logits that the KV-cache
step computes for position `i` are the logits a full forward gives at `i`. What runs in
parallel is every position of one forward; what runs in sequence is only the choice of the
next token, which needs the logits of the one before.

A step is the model's own forward over the new tokens (the same blocks, with a cache; where
nothing listens, one check of the fused kernels per step). Batches are left-padded, so that
the last position of every row is a real token whose logits choose the next one. A row that
has ended (`_stopping`) is continued with padding, masked out in the returned mask. Hooks
attached to the model run at every step.
"""

import contextvars
import dataclasses
import math
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from hookedattn.core import _tokenization
from hookedattn.core.cache import ActivationCache
from hookedattn.core.generation._options import GenerationOptions, Prompt
from hookedattn.core.generation._recording import StepRecorder
from hookedattn.core.generation._sampling import FrequencyPenalty, RowSampler, choose_next_tokens
from hookedattn.core.generation._stopping import StopRule, stop_rule
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.kv_cache import KeyValueCache


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
    def from_steps(cls, prompt: Prompt, steps: Iterable[GenerationStep]) -> "Generated":
        """The prompt and the tokens of `steps` (run to the end here), with their mask: a
        token is real up to and including the one that ends its row."""
        new_tokens, real = [], []
        for step in steps:
            new_tokens.append(step.tokens)
            real.append(step.real)
        if not new_tokens:
            return cls(prompt.tokens, prompt.attention_mask, 0)
        return cls(
            torch.cat([prompt.tokens, torch.stack(new_tokens, dim=1)], dim=1),
            torch.cat([prompt.attention_mask, torch.stack(real, dim=1).long()], dim=1),
            len(new_tokens),
        )


def generation_steps(
    model: Any,
    prompt: Prompt,
    options: GenerationOptions,
    recorder: StepRecorder | None = None,
    record_last: bool = False,
) -> Iterator[GenerationStep]:
    """Generate step by step, yielding each step's choice and logits (`options` say how).

    With `use_past_kv_cache` the prompt runs once and every later step runs only the new
    token against the cache; without, every step runs the whole sequence again. Both give
    the same logits (the tests check it). With a `recorder` attached, each step carries
    the activations of its forward; `record_last` runs one more forward over the last
    tokens chosen, so that the recorder holds every position (its logits are not a step).
    Meanwhile each layer keeps its fused q/k/v weights (`keeping_fused_weights`).
    """
    batch, n_prompt = prompt.tokens.shape
    _check_length(model.cfg, n_prompt, options.n_steps)
    stop = _stop_rule(model, options, batch, prompt.tokens.device)
    choose = _chooser(model, options, prompt)
    capacity = n_prompt + options.n_steps  # the last forward of `record_last` included
    cache = None
    if options.use_past_kv_cache:
        cache = KeyValueCache.empty(model.cfg, batch, capacity=capacity)
    loop = _Loop(model, prompt, cache, choose, stop, recorder)
    with model.keeping_fused_weights():
        yield from _stepwise(loop.steps(options.n_steps, record_last), recorder)


def _check_length(cfg: Any, n_prompt: int, n_steps: int) -> None:
    if n_prompt + n_steps > cfg.n_ctx:
        raise ValueError(
            f"a prompt of {n_prompt} positions plus max_new_tokens={n_steps} exceeds "
            f"the model's n_ctx={cfg.n_ctx}; at most {cfg.n_ctx - n_prompt} new "
            f"tokens fit after this prompt"
        )


def _stop_rule(model: Any, options: GenerationOptions, batch: int, device: Any) -> StopRule:
    """When each row ends: the options' stop tokens and strings, and per-row limits."""
    tokenizer = _tokenization.tokenizer_of(model) if model.tokenizer is not None else None
    stop = stop_rule(
        tokenizer,
        stop_at_eos=options.stop_at_eos,
        eos_token_id=options.eos_token_id,
        stop_strings=options.stop_strings,
        device=device,
    )
    vocab = model.cfg.d_vocab_out
    outside = [t for t in stop.stop_tokens.tolist() if not 0 <= t < vocab]
    if outside:
        raise ValueError(
            f"eos_token_id {outside} is outside the model's output vocabulary (ids 0.."
            f"{vocab - 1}): no step could ever choose it, so no row would end there"
        )
    limits = options.limits
    if limits is None:
        return stop
    if len(limits) != batch:
        raise ValueError(
            f"max_new_tokens has {len(limits)} entries but there are {batch} rows: give "
            f"one per row, or one int for all"
        )
    return dataclasses.replace(stop, limits=torch.tensor(limits, device=device))


class _Chooser:
    """Each step's choice of the next tokens from the logits: the logits steps (the
    frequency penalty), then greedy or a draw (`generator`, or a generator per row)."""

    def __init__(
        self, options: GenerationOptions, batch: int, penalty: FrequencyPenalty | None
    ) -> None:
        self.sampling, self.generator, self.penalty = options.sampling, options.generator, penalty
        self.rows = None
        if options.seed is not None:
            self.rows = RowSampler.for_batch(options.seed, batch)

    def __call__(self, logits: Float[Tensor, "batch d_vocab_out"]) -> Int[Tensor, " batch"]:
        if self.penalty is not None:
            logits = self.penalty(logits)
        if self.rows is not None:
            return self.rows.choose(logits, self.sampling)
        return choose_next_tokens(logits, self.sampling, self.generator)

    def chosen(self, tokens: Int[Tensor, " batch"], real: Bool[Tensor, " batch"]) -> None:
        """What the logits steps keep of each step: the tokens chosen."""
        if self.penalty is not None:
            self.penalty.add(tokens, real)


def _chooser(model: Any, options: GenerationOptions, prompt: Prompt) -> _Chooser:
    penalty = None
    if options.freq_penalty:
        d_vocab = model.cfg.d_vocab_out
        args = (options.freq_penalty, options.sampling, prompt.tokens, prompt.attention_mask)
        penalty = FrequencyPenalty(*args, d_vocab)
    return _Chooser(options, prompt.tokens.shape[0], penalty)


def _stepwise(steps: Iterator[GenerationStep], recorder: StepRecorder | None) -> Iterator:
    """`steps`, each one made without gradients and with the recording hooks attached, and
    neither while the caller holds a step: their own forwards between steps are theirs.
    (`@torch.no_grad()` on a generator does this, but not once a type checker wraps it.)"""
    try:
        while True:
            with torch.no_grad():
                if recorder is None:
                    step = next(steps, None)
                else:
                    with recorder.attached():
                        step = next(steps, None)
            if step is None:
                return
            yield step
    finally:
        steps.close()


class _Loop:
    """The state of one generation: the tokens so far (without a KV cache, every step runs
    them all), which rows are padded or ended, and how a step's forward runs."""

    def __init__(
        self,
        model: Any,
        prompt: Prompt,
        cache: KeyValueCache | None,
        choose: _Chooser,
        stop: StopRule,
        recorder: StepRecorder | None,
    ) -> None:
        self.model, self.cache, self.choose, self.stop = model, cache, choose, stop
        self.recorder = recorder
        self.tokens, self.mask = prompt.tokens, prompt.attention_mask
        self.new_tokens, self.new_mask = self.tokens, self.mask
        self.n_prompt = self.tokens.shape[1]
        # Without padding the forward takes no mask: it then skips the padding checks and
        # per-row positions, a third of the torch calls of a one-token step.
        self.padded = prompt.padded

    def steps(self, n_steps: int, record_last: bool) -> Iterator[GenerationStep]:
        """`n_steps` steps (fewer if every row ends first), then the last forward if asked."""
        stop, pads = self.stop, self.stop.pads  # the rule is fixed for the run: asked once
        ended = stop.ended_before_start(self.tokens.shape[0], self.tokens.device)
        real = ~ended  # without a stop rule, every token is real: one tensor for all steps
        for n_done in range(1, n_steps + 1):
            logits, cache, known_finite = self.forward()
            if n_done == 1 and self.recorder is not None:  # before the steps that would fail
                self.recorder.check_room(self.n_prompt, self.n_prompt + n_steps, logits.device)
            if not known_finite:
                _check_finite(logits, ended, n_done)
            chosen = self.choose(logits)
            if pads:  # an ended row continues with padding, masked out
                real = ~ended
                chosen = torch.where(ended, torch.full_like(chosen, stop.pad), chosen)
                self.padded = self.padded or bool(ended.any())
                ended = stop.ended(chosen, ended, n_done)
            self.choose.chosen(chosen, real)
            self.advance(chosen, real)
            yield GenerationStep(chosen, logits, ended, real, cache)
            if pads and bool(ended.all()):
                break
        if record_last and self.recorder is not None:
            self.forward()
        if self.recorder is not None and self.recorder.deferred:
            self.recorder.finish(self.cache)

    def advance(self, chosen: Int[Tensor, " batch"], real: Bool[Tensor, " batch"]) -> None:
        """The next forward's input: the chosen tokens (with the KV cache, alone)."""
        self.new_tokens = chosen[:, None]
        if self.padded or self.cache is None:  # otherwise the forward takes no mask
            self.new_mask = real.long()[:, None]
        if self.cache is None:
            self.tokens = torch.cat([self.tokens, self.new_tokens], dim=1)
            self.mask = torch.cat([self.mask, self.new_mask], dim=1)

    def forward(
        self,
    ) -> tuple[Float[Tensor, "batch d_vocab_out"], ActivationCache | None, bool]:
        """The logits of each row's last position, the activations recorded, and whether
        the logits are known to be finite (`_logits`)."""
        offset = 0 if self.cache is None else self.cache.length
        position = _POSITION.set(GenerationPosition(offset, self.n_prompt))
        try:
            logits, known_finite = self._logits()
        finally:
            _POSITION.reset(position)
        if self.recorder is None:
            return logits, None, known_finite
        return logits, self.recorder.take(), known_finite

    def _logits(self) -> tuple[Float[Tensor, "batch d_vocab_out"], bool]:
        """The logits of each row's last position, and whether they are known to be finite:
        a one-token step whose fused kernels' guard read them (`model._next_token_step`)."""
        model, cache = self.model, self.cache
        if self.recorder is not None:
            self.recorder.before_forward(0 if cache is None else cache.length)
        mask = self.new_mask if self.padded else None
        if cache is None:
            tokens, mask = self.tokens, self.mask if self.padded else None
            return _last_logits(model, tokens, mask, None), False
        if cache.length == 0:  # the prompt
            return _last_logits(model, self.new_tokens, mask, cache), False
        if mask is not None:
            logits = model(self.new_tokens, attention_mask=mask, past_kv_cache=cache)
            return logits[:, -1], False
        # One more real token per row: the forward without its input checks (nor the
        # model's `__call__`: a recorder counts it as its own forward).
        if self.recorder is None:
            return model._next_token_step(self.new_tokens, cache)
        with self.recorder.own_forward():
            return model._next_token_step(self.new_tokens, cache)


def _check_finite(
    logits: Float[Tensor, "batch d_vocab_out"], ended: Bool[Tensor, " batch"], n_done: int
) -> None:
    """Refuse logits that are not finite in a row still generating: a token chosen from
    them (the argmax of NaNs is token 0) would read as ordinary text. (One synchronisation
    per step; a row that has ended continues with padding whatever its logits.)"""
    if math.isfinite(logits.sum().item()):  # one reduction: a sum is finite only when
        return  # every term is (or it overflows: then the rows are looked at, for nothing)
    bad = ~(logits.isfinite().all(dim=-1) | ended)
    if bool(bad.any()):
        rows = bad.nonzero().flatten().tolist()
        raise ValueError(
            f"the logits of rows {rows} at new token {n_done} are not finite (NaN or inf): a "
            f"hook (a steering vector or scale that is not finite?) or a weight made them so; "
            f"generation never chooses a token from them. model(tokens) with the same hooks "
            f"shows where they start"
        )


def _last_logits(
    model: Any, tokens: Tensor, attention_mask: Tensor | None, cache: KeyValueCache | None
) -> Float[Tensor, "batch d_vocab_out"]:
    """The logits of each row's last position, the one the next token is chosen from.

    Where no hook reads the final norm or the unembedding, only that position goes through
    them (a prompt of 16 tokens would otherwise pay 16 unembeddings for one); where one
    does (or a forward installed on one, nnsight's), every position does, so that the hook
    sees the whole forward.
    """
    model._notice_wrappers()  # before the first forward of a model wrapped since its last
    if any(_hooked(m) for m in (model.ln_final, model.unembed_transform, model.unembed)):
        return model(tokens, attention_mask=attention_mask, past_kv_cache=cache)[:, -1]
    n_layers = model.cfg.n_layers
    resid = model(
        tokens, attention_mask=attention_mask, past_kv_cache=cache, stop_at_layer=n_layers
    )
    return model.unembed(model.unembed_transform(model.ln_final(resid[:, -1:])))[:, -1]


def _hooked(module: torch.nn.Module) -> bool:
    """Whether a hook point in `module` has a hook attached (or an installed forward)."""
    return any(isinstance(m, HookPoint) and m.is_active for m in module.modules())
