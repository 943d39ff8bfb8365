"""When a row of a generation ends: at a stop token, once its text contains a stop string, or
after its own number of new tokens.

A row that has ended continues with padding (masked out in the returned attention mask) so
that the batch stays one rectangle; the loop ends when every row has. The token that ends a
row (the stop token, the token that completes a stop string) is part of the row.
"""

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import torch
from jaxtyping import Bool, Int
from torch import Tensor


@dataclasses.dataclass
class StopRule:
    """Which rows have ended: `stop_tokens` (ids), `stop_strings` (read by `decode` from a
    row's generated ids), `limits` (new tokens per row, None: no limit but the run's). An
    ended row continues with `pad`."""

    stop_tokens: Int[Tensor, " n_stop"]
    pad: int
    limits: Int[Tensor, " batch"] | None = None
    stop_strings: tuple[str, ...] = ()
    decode: Callable[[list[int]], str] | None = None
    _generated: list[list[int]] = dataclasses.field(default_factory=list)

    @property
    def pads(self) -> bool:
        """Whether a row can end before the others (and then continues with padding)."""
        return bool(self.stop_tokens.numel() or self.stop_strings or self.limits is not None)

    def ended_before_start(self, batch: int, device: torch.device) -> Bool[Tensor, " batch"]:
        """The rows with no new token to generate (a limit of 0)."""
        if self.limits is None:
            return torch.zeros(batch, dtype=torch.bool, device=device)
        return self.limits.to(device) == 0

    def ended(
        self, chosen: Int[Tensor, " batch"], ended: Bool[Tensor, " batch"], n_done: int
    ) -> Bool[Tensor, " batch"]:
        """The rows ended once `chosen` (the `n_done`-th new token of each row) is added."""
        if self.stop_tokens.numel():
            ended = ended | torch.isin(chosen, self.stop_tokens)
        if self.limits is not None:
            ended = ended | (self.limits.to(chosen.device) <= n_done)
        if self.stop_strings:
            ended = ended | self._completes_a_stop_string(chosen, ended)
        return ended

    def _completes_a_stop_string(
        self, chosen: Int[Tensor, " batch"], ended: Bool[Tensor, " batch"]
    ) -> Bool[Tensor, " batch"]:
        if not self._generated:
            self._generated = [[] for _ in range(chosen.shape[0])]
        hits = []
        for row, (token, done) in enumerate(zip(chosen.tolist(), ended.tolist(), strict=True)):
            if not done:
                self._generated[row].append(token)
            # The text before this token held no stop string (the row would have ended),
            # so a stop string in it now ends with this token.
            text = self.decode(self._generated[row]) if not done else ""
            hits.append(any(s in text for s in self.stop_strings))
        return torch.tensor(hits, dtype=torch.bool, device=chosen.device)


def stop_rule(
    tokenizer: Any,
    *,
    stop_at_eos: bool,
    eos_token_id: int | Sequence[int] | None,
    stop_strings: str | Sequence[str] | None,
    device: torch.device,
) -> StopRule:
    """The stop rule of `generate`'s arguments, checked (errors name the bad value); the
    per-row limits are added by the generation loop, which reads `max_new_tokens`."""
    stop_tokens = _stop_tokens(eos_token_id, tokenizer, stop_at_eos)
    if isinstance(stop_strings, str):
        stop_strings = [stop_strings]
    stop_strings = tuple(stop_strings or ())
    if not all(isinstance(s, str) and s for s in stop_strings):
        raise ValueError(f"stop_strings must be non-empty strings, got {stop_strings!r}")
    if stop_strings and tokenizer is None:
        raise ValueError("stop_strings needs a tokenizer to read the text: this model has none")
    pad = tokenizer.padding_id() if tokenizer is not None else (stop_tokens or [0])[0]
    decode = None
    if stop_strings:
        decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=True)
    ids = torch.tensor(stop_tokens, dtype=torch.long, device=device)
    return StopRule(ids, pad, None, stop_strings, decode)


def _stop_tokens(eos_token_id: Any, tokenizer: Any, stop_at_eos: bool) -> list[int]:
    if not stop_at_eos:
        return []
    if eos_token_id is None:
        eos_token_id = None if tokenizer is None else tokenizer.eos_token_id
    if eos_token_id is None:
        raise ValueError(
            "stop_at_eos=True needs an end-of-sequence token, and this model's tokenizer "
            "has none: pass eos_token_id=, or stop_at_eos=False"
        )
    ids = [eos_token_id] if isinstance(eos_token_id, int) else list(eos_token_id)
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        raise ValueError(f"eos_token_id must be an int or a list of ints, got {eos_token_id!r}")
    return ids
