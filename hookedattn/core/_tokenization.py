"""Text to token tensors and back, for a model with a tokenizer.

The functions behind `HookedTransformer.to_tokens`, `to_str_tokens`, `to_string`,
`to_single_token` and `get_token_position`; the forward's input stage (`_inputs`) tokenizes
strings with `tokenize`.
A batch of strings of different lengths is padded; `tokenize` returns the tokens together
with the attention mask that says which positions are real, and the forward uses that mask,
so every real token of a padded batch gets the result it would get alone.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Int
from torch import Tensor

from hookedattn.core.tokenizers import Tokenizer, is_text, tokenizer_of


@dataclasses.dataclass(frozen=True)
class TokenizedText:
    """Padded token ids and the mask of real tokens (1) and padding (0), both `[batch pos]`."""

    tokens: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]

    def __repr__(self) -> str:
        batch, pos = self.tokens.shape
        n_pad = int((self.attention_mask == 0).sum())
        return f"TokenizedText(batch={batch}, pos={pos}, padding={n_pad})"


def _bos(tokenizer: Tokenizer, prepend_bos: bool | None) -> list[int]:
    """`[bos]` or `[]`; by default BOS is prepended when the tokenizer has one."""
    if prepend_bos is None:
        prepend_bos = tokenizer.bos_token_id is not None
    if not prepend_bos:
        return []
    if tokenizer.bos_token_id is None:
        raise ValueError(f"prepend_bos=True but {tokenizer!r} has no BOS token")
    return [tokenizer.bos_token_id]


def tokenize(
    model: Any,
    text: Any,
    prepend_bos: bool | None = None,
    padding_side: str = "right",
) -> TokenizedText:
    """Token ids and attention mask of a string or a batch of strings, padded to one length.

    With left padding the BOS (if any) sits right before each prompt's first token, after
    the padding, as in TransformerLens.
    """
    if padding_side not in ("right", "left"):
        raise ValueError(f"padding_side must be 'right' or 'left', got {padding_side!r}")
    if not is_text(text):
        raise TypeError(f"expected a string or a list of strings, got {_describe(text)}")
    tokenizer = tokenizer_of(model)
    texts = [text] if isinstance(text, str) else text
    rows = [_bos(tokenizer, prepend_bos) + tokenizer.encode(t) for t in texts]
    _check_vocab(model, tokenizer, rows)
    length = max(len(r) for r in rows)
    pad = tokenizer.padding_id()
    tokens, mask = [], []
    for row in rows:
        fill = length - len(row)
        if padding_side == "right":
            tokens.append(row + [pad] * fill)
            mask.append([1] * len(row) + [0] * fill)
        else:
            tokens.append([pad] * fill + row)
            mask.append([0] * fill + [1] * len(row))
    device = model.cfg.device
    return TokenizedText(
        torch.tensor(tokens, dtype=torch.long, device=device).reshape(len(rows), length),
        torch.tensor(mask, dtype=torch.long, device=device).reshape(len(rows), length),
    )


def _check_vocab(model: Any, tokenizer: Tokenizer, rows: list[list[int]]) -> None:
    d_vocab = model.cfg.d_vocab
    high = max((max(r) for r in rows if r), default=-1)
    if high >= d_vocab:
        raise ValueError(
            f"the tokenizer produced token id {high} but the model has d_vocab={d_vocab}; "
            f"build the model with d_vocab >= {tokenizer.vocab_size} for {tokenizer!r}"
        )


def _describe(x: object) -> str:
    if isinstance(x, Tensor):
        return f"a tensor of shape {tuple(x.shape)}"
    if isinstance(x, list) and not x:
        return "an empty list"
    return type(x).__name__


def _token_row(tokens: Any) -> list[int]:
    """One sequence of ids from `[pos]`, `[1 pos]` or a list of ints."""
    if isinstance(tokens, Tensor):
        if tokens.ndim == 2 and tokens.shape[0] == 1:
            tokens = tokens[0]
        if tokens.ndim != 1 or tokens.dtype.is_floating_point:
            raise ValueError(
                f"expected token ids of shape [pos] or [1 pos], got {tokens.dtype} of shape "
                f"{tuple(tokens.shape)}"
            )
        return [int(t) for t in tokens.tolist()]
    if isinstance(tokens, Sequence) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in tokens
    ):
        return list(tokens)
    raise TypeError(f"expected token ids (a tensor or a list of ints), got {_describe(tokens)}")


def to_str_tokens(
    model: Any, input: Any, prepend_bos: bool | None = None
) -> list[str] | list[list[str]]:
    """Each token as a string: `list[str]` for a string or one sequence of ids, and one
    such list per string for a list of strings (each tokenized alone, unpadded)."""
    tokenizer = tokenizer_of(model)
    if isinstance(input, str):
        return [
            tokenizer.str_token(t) for t in tokenize(model, input, prepend_bos).tokens[0].tolist()
        ]
    if is_text(input):
        return [to_str_tokens(model, t, prepend_bos) for t in input]
    if isinstance(input, Tensor) and input.ndim == 2 and input.shape[0] > 1:
        raise ValueError(
            f"to_str_tokens takes one sequence ([pos] or [1 pos]), got a batch of shape "
            f"{tuple(input.shape)}; call it on each row"
        )
    return [tokenizer.str_token(t) for t in _token_row(input)]


def to_string(model: Any, tokens: Any) -> str | list[str]:
    """The text of token ids: a string for `[pos]` (or a list of ints), one per row for
    `[batch pos]`. Special tokens are written by name, as TransformerLens does."""
    tokenizer = tokenizer_of(model)
    if isinstance(tokens, Tensor) and tokens.ndim == 2:
        return [tokenizer.decode(row.tolist()) for row in tokens]
    if isinstance(tokens, Tensor) and tokens.ndim != 1:
        raise ValueError(f"expected token ids [pos] or [batch pos], got {_describe(tokens)}")
    return tokenizer.decode(_token_row(tokens))


def to_single_token(model: Any, string: Any) -> int:
    """The id of a string that is exactly one token; a `ValueError` shows its tokens if not."""
    tokenizer = tokenizer_of(model)
    ids = tokenizer.encode(string)
    if len(ids) != 1:
        pieces = [tokenizer.str_token(i) for i in ids]
        raise ValueError(f"{string!r} is {len(ids)} tokens, not one: {pieces}")
    return ids[0]


def get_token_position(
    model: Any,
    single_token: Any,
    input: Any,
    mode: str = "first",
    prepend_bos: bool | None = None,
) -> int:
    """The position of `single_token` in `input` (a string, tokenized with `prepend_bos`,
    or one sequence of ids): its first occurrence, or its last with `mode="last"`."""
    if mode not in ("first", "last"):
        raise ValueError(f"mode must be 'first' or 'last', got {mode!r}")
    token = to_single_token(model, single_token) if isinstance(single_token, str) else single_token
    if not isinstance(token, int) or isinstance(token, bool):
        raise TypeError(f"single_token must be a string or an int id, got {_describe(token)}")
    if isinstance(input, str):
        row = tokenize(model, input, prepend_bos).tokens[0].tolist()
    else:
        row = _token_row(input)
    places = [i for i, t in enumerate(row) if t == token]
    if not places:
        shown = to_str_tokens(model, row) if getattr(model, "tokenizer", None) else row
        raise ValueError(f"token {single_token!r} (id {token}) does not occur in {shown}")
    return places[0] if mode == "first" else places[-1]
