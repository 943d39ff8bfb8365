"""Tokenizers: text to token ids and back, with no download.

Three kinds share one small interface (`Tokenizer`):

- `ByteTokenizer`: one id per UTF-8 byte (0..255), then `<bos>`, `<eos>`, `<pad>`
  (256, 257, 258). It reads any string and gives it back exactly.
- `CharTokenizer`: one id per character of a given alphabet, then its special tokens.
- `HFTokenizer`: an adapter around a HuggingFace tokenizer object the user already has (a
  `transformers` tokenizer or a `tokenizers.Tokenizer`); nothing of HuggingFace is
  imported here.

`as_tokenizer(obj)` returns one of these for anything a model is given as its tokenizer.
Special tokens are never produced by encoding text: the text `"<bos>"` is five bytes, so
that encoding and decoding round-trip every string.
"""

import dataclasses
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True)
class SpecialTokens:
    """The ids of the special tokens a tokenizer has (None where it has none)."""

    bos: int | None = None
    eos: int | None = None
    pad: int | None = None


class Tokenizer:
    """The interface the model uses: `encode`, `decode`, `str_token`, special token ids.

    `TransformerLens` code reads `tokenizer.bos_token_id`, `eos_token_id`, `pad_token_id`
    and `vocab_size`; every tokenizer here has them.
    """

    specials: SpecialTokens
    vocab_size: int

    def encode(self, text: str) -> list[int]:
        """The ids of `text`, with no special tokens added."""
        raise NotImplementedError

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of `ids`; special tokens are written by name unless skipped."""
        raise NotImplementedError

    def str_token(self, token_id: int) -> str:
        """How one token reads on its own (what `to_str_tokens` shows)."""
        raise NotImplementedError

    @property
    def bos_token_id(self) -> int | None:
        """The beginning-of-sequence id, or None."""
        return self.specials.bos

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence id, or None."""
        return self.specials.eos

    @property
    def pad_token_id(self) -> int | None:
        """The padding id, or None."""
        return self.specials.pad

    def padding_id(self) -> int:
        """The id written at padded positions: PAD, else EOS, else BOS, else 0.

        Padded positions are masked out by the attention mask, so which id fills them never
        changes a real token's result; TransformerLens pads GPT-2 with EOS the same way.
        """
        for token_id in (self.specials.pad, self.specials.eos, self.specials.bos):
            if token_id is not None:
                return token_id
        return 0

    def _check_ids(self, ids: Sequence[int]) -> None:
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(
                    f"token id {i} is out of range for this tokenizer: ids are "
                    f"0..{self.vocab_size - 1}"
                )


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as tokens: ids 0..255 are bytes, 256 `<bos>`, 257 `<eos>`, 258 `<pad>`.

    `decode(encode(s)) == s` for every string of characters. A lone surrogate
    (`"\\ud800"`, half of a UTF-16 pair, which Python strings can hold) is not a character
    and has no UTF-8 bytes: `encode` refuses it with a `ValueError` naming its position. A
    byte that is not a whole character shows as an escape in `str_token` (`"\\xe2"`);
    `decode` of a byte sequence that is not valid UTF-8 (a generation may stop
    mid-character) writes U+FFFD for the broken part.
    """

    SPECIAL_NAMES = ("<bos>", "<eos>", "<pad>")

    def __init__(self) -> None:
        self.specials = SpecialTokens(bos=256, eos=257, pad=258)
        self.vocab_size = 259

    def encode(self, text: str) -> list[int]:
        """The UTF-8 bytes of `text`; a lone surrogate is a `ValueError` naming it."""
        try:
            return list(_check_text(text).encode("utf-8"))
        except UnicodeEncodeError as error:
            raise ValueError(
                f"{text[error.start]!r} at position {error.start} of the text is a lone "
                f"surrogate (half of a UTF-16 pair), not a character: it has no UTF-8 bytes "
                f"to encode. Decode the text with errors='replace' or 'surrogatepass' first"
            ) from None

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of the byte ids; special tokens written as `<bos>` etc. unless skipped."""
        ids = list(ids)
        self._check_ids(ids)
        parts: list[str] = []
        run = bytearray()
        for i in ids:
            if i < 256:
                run.append(i)
                continue
            parts.append(run.decode("utf-8", errors="replace"))
            run = bytearray()
            if not skip_special_tokens:
                parts.append(self.SPECIAL_NAMES[i - 256])
        parts.append(run.decode("utf-8", errors="replace"))
        return "".join(parts)

    def str_token(self, token_id: int) -> str:
        """The character of an ASCII byte, an escape such as `\\xe2` for other bytes."""
        self._check_ids([token_id])
        if token_id >= 256:
            return self.SPECIAL_NAMES[token_id - 256]
        return bytes([token_id]).decode("utf-8", errors="backslashreplace")

    def __repr__(self) -> str:
        return "ByteTokenizer(vocab_size=259, bos=256, eos=257, pad=258)"


class CharTokenizer(Tokenizer):
    """One token per character of `alphabet` (ids in alphabet order), then the specials.

    `CharTokenizer("ab ")` has ids a=0, b=1, " "=2, `<bos>`=3, `<eos>`=4, `<pad>`=5. Pass
    `bos_token=None` (etc.) to leave a special token out. A character outside the alphabet
    is a `ValueError` naming it, and so is a special token that is also a character of the
    alphabet (its text would decode to two different ids).
    """

    def __init__(
        self,
        alphabet: str | Sequence[str],
        *,
        bos_token: str | None = "<bos>",
        eos_token: str | None = "<eos>",
        pad_token: str | None = "<pad>",
    ) -> None:
        chars = list(alphabet)
        if not chars:
            raise ValueError("the alphabet of a CharTokenizer must not be empty")
        bad = [c for c in chars if not isinstance(c, str) or len(c) != 1]
        if bad:
            raise ValueError(f"an alphabet holds single characters, got {bad[:5]}")
        repeated = sorted({c for c in chars if chars.count(c) > 1})
        if repeated:
            raise ValueError(f"characters {repeated} appear more than once in the alphabet")
        self.alphabet = "".join(chars)
        self._ids = {c: i for i, c in enumerate(chars)}
        names = [t for t in (bos_token, eos_token, pad_token) if t is not None]
        if len(set(names)) != len(names):
            raise ValueError(f"special tokens must be distinct, got {names}")
        clashing = [t for t in names if t in self._ids]
        if clashing:
            raise ValueError(
                f"special tokens {clashing} are also characters of the alphabet "
                f"{self.alphabet!r}; choose special tokens outside it (the default names "
                f"are '<bos>', '<eos>', '<pad>')"
            )
        self._names = list(chars) + names
        next_id = iter(range(len(chars), len(chars) + len(names)))
        self.specials = SpecialTokens(
            bos=None if bos_token is None else next(next_id),
            eos=None if eos_token is None else next(next_id),
            pad=None if pad_token is None else next(next_id),
        )
        self.vocab_size = len(self._names)

    def encode(self, text: str) -> list[int]:
        """One id per character; a character outside the alphabet is a `ValueError`."""
        ids = []
        for position, char in enumerate(_check_text(text)):
            if char not in self._ids:
                raise ValueError(
                    f"character {char!r} at position {position} of {text!r} is not in the "
                    f"alphabet {self.alphabet!r}"
                )
            ids.append(self._ids[char])
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The characters of `ids`; special tokens by name unless skipped."""
        ids = list(ids)
        self._check_ids(ids)
        n_chars = len(self.alphabet)
        return "".join(self._names[i] for i in ids if i < n_chars or not skip_special_tokens)

    def str_token(self, token_id: int) -> str:
        """The character (or special token name) of one id."""
        self._check_ids([token_id])
        return self._names[token_id]

    def __repr__(self) -> str:
        return f"CharTokenizer({self.alphabet!r}, vocab_size={self.vocab_size})"


class HFTokenizer(Tokenizer):
    """A HuggingFace tokenizer behind our interface; nothing of HuggingFace is imported.

    Wraps a `transformers` tokenizer (anything with `convert_ids_to_tokens`) or a bare
    `tokenizers.Tokenizer` (anything with `id_to_token`). Special tokens come from the
    wrapped object (`bos_token_id`...), or, for a bare `tokenizers.Tokenizer`, from the
    token strings given here. The wrapped object is `hf_tokenizer`.
    """

    def __init__(
        self,
        hf_tokenizer: Any,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
    ) -> None:
        self.hf_tokenizer = hf_tokenizer
        self._is_transformers = hasattr(hf_tokenizer, "convert_ids_to_tokens")
        if not self._is_transformers and not hasattr(hf_tokenizer, "id_to_token"):
            raise TypeError(
                f"{type(hf_tokenizer).__name__} is not a HuggingFace tokenizer: expected a "
                f"transformers tokenizer or a tokenizers.Tokenizer"
            )
        if self._is_transformers:
            self.vocab_size = len(hf_tokenizer)
            self.specials = SpecialTokens(
                bos=self._given_or(bos_token, hf_tokenizer.bos_token_id),
                eos=self._given_or(eos_token, hf_tokenizer.eos_token_id),
                pad=self._given_or(pad_token, hf_tokenizer.pad_token_id),
            )
        else:
            self.vocab_size = hf_tokenizer.get_vocab_size(with_added_tokens=True)
            self.specials = SpecialTokens(
                bos=self._given_or(bos_token, None),
                eos=self._given_or(eos_token, None),
                pad=self._given_or(pad_token, None),
            )

    def _given_or(self, token: str | None, default: int | None) -> int | None:
        if token is None:
            return default
        token_id = self._token_to_id(token)
        if token_id is None:
            raise ValueError(f"special token {token!r} is not in the tokenizer's vocabulary")
        return token_id

    def _token_to_id(self, token: str) -> int | None:
        if self._is_transformers:
            return self.hf_tokenizer.get_vocab().get(token)
        return self.hf_tokenizer.token_to_id(token)

    def encode(self, text: str) -> list[int]:
        """The wrapped tokenizer's ids for `text`, without its own special tokens."""
        _check_text(text)
        if self._is_transformers:
            return list(self.hf_tokenizer.encode(text, add_special_tokens=False))
        return list(self.hf_tokenizer.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The wrapped tokenizer's text for `ids`."""
        ids = [int(i) for i in ids]
        self._check_ids(ids)
        return self.hf_tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def str_token(self, token_id: int) -> str:
        """The text of one token decoded alone (`" world"`, not the byte-level `"Ġworld"`)."""
        return self.decode([token_id])

    def __repr__(self) -> str:
        return f"HFTokenizer({type(self.hf_tokenizer).__name__}, vocab_size={self.vocab_size})"


def as_tokenizer(obj: Any) -> Tokenizer:
    """`obj` itself if it is a `Tokenizer`, else an `HFTokenizer` around it."""
    if isinstance(obj, Tokenizer):
        return obj
    if hasattr(obj, "convert_ids_to_tokens") or hasattr(obj, "id_to_token"):
        return HFTokenizer(obj)
    raise TypeError(
        f"cannot use a {type(obj).__name__} as a tokenizer: give a ByteTokenizer, a "
        f"CharTokenizer, or a HuggingFace tokenizer object"
    )


def _check_text(text: object) -> str:
    if not isinstance(text, str):
        raise TypeError(f"expected a string to tokenize, got {type(text).__name__}")
    return text


def is_text(input: object) -> bool:
    """Whether `input` is a string or a non-empty list of strings."""
    if isinstance(input, str):
        return True
    return isinstance(input, list) and bool(input) and all(isinstance(i, str) for i in input)


def tokenizer_of(model: Any) -> Tokenizer:
    """The model's tokenizer behind our interface; a `ValueError` if it has none."""
    if getattr(model, "tokenizer", None) is None:
        raise ValueError(
            "this model has no tokenizer, so it cannot read or write strings; pass token "
            "ids, or build it with tokenizer= (e.g. hookedattn.ByteTokenizer())"
        )
    return as_tokenizer(model.tokenizer)
