"""Inputs for a collection: texts or token ids packed into fixed-length contexts.

Every context is `[start token] + (context - 1)` tokens of one flat token stream, taken in
order: context `i` holds stream tokens `i*(context-1) .. (i+1)*(context-1)`. Documents are
tokenized and joined end to end (with `separator` between them when one is given), so the
packing depends only on the inputs and the three numbers recorded in `Packing`; its digest
(SHA-256 of the stream as int32) goes into the store's manifest.

What can go in: a string, a `Path` to a text file, a 1-D token tensor (each one document),
a dict with a `"text"` field (a HuggingFace `datasets` row), or an iterable of any of these;
a 2-D token tensor `[batch pos]` is taken as contexts already packed (its width must be the
context). `None` is the default corpus: the training split of the Python standard library's
own source, the bytes the shipped models were trained on, so a fresh machine needs no
download.
"""

import dataclasses
import hashlib
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import safetensors.torch
import torch
from jaxtyping import Int
from torch import Tensor

from hookedattn.core import tokenizer_of

DEFAULT_SOURCE = "stdlib-train"


@dataclasses.dataclass(frozen=True)
class Packing:
    """How the contexts were made: enough to rebuild them from the same inputs.

    `context` tokens per context, the first being `bos`; `separator` joins documents (None:
    nothing between them); `n_contexts` were kept; `sha256` digests the token stream they
    were cut from; `source` says what the inputs were.
    """

    context: int
    bos: int | None
    separator: int | None
    n_contexts: int
    source: str
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready record for the manifest."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class PackedContexts:
    """`n_contexts` contexts of `context` tokens, cut on demand from one token stream."""

    stream: Int[Tensor, " token"]
    packing: Packing
    packed: Int[Tensor, "batch pos"] | None = None  # contexts given ready-made

    def __len__(self) -> int:
        return self.packing.n_contexts

    def contexts(self, start: int, stop: int) -> Int[Tensor, "batch pos"]:
        """Contexts `start .. stop` (int64 token ids, the start token first)."""
        if not 0 <= start <= stop <= len(self):
            raise IndexError(f"contexts {start}..{stop} out of range 0..{len(self)}")
        if self.packed is not None:
            return self.packed[start:stop].long()
        body = self.packing.context - 1
        rows = self.stream[start * body : stop * body].long().reshape(stop - start, body)
        bos = torch.full((stop - start, 1), self.packing.bos, dtype=torch.long)
        return torch.cat([bos, rows], dim=1)

    @property
    def n_tokens(self) -> int:
        """Tokens in all the contexts, start tokens included."""
        return len(self) * self.packing.context


def pack(
    model: Any,
    inputs: Any = None,
    *,
    context: int | None = None,
    n_tokens: int | float | None = None,
    separator: int | None = None,
) -> PackedContexts:
    """Pack `inputs` (see the module docstring) into contexts for `model`.

    `context` (an int) defaults to the model's `n_ctx`; `n_tokens` (a positive, finite
    number) caps how many tokens are kept (rounded up to whole contexts; an error when the
    inputs hold fewer); iterables are read only until that many tokens are in.
    """
    context = model.cfg.n_ctx if context is None else context
    if not _is_int(context) or not 2 <= context <= model.cfg.n_ctx:
        raise ValueError(
            f"context must be an int in 2..{model.cfg.n_ctx} (the model's n_ctx), got {context!r}"
        )
    wanted = None if n_tokens is None else _contexts_for(n_tokens, context)
    if separator is not None and not _is_int(separator):
        raise ValueError(f"separator must be a token id (an int) or None, got {separator!r}")
    if isinstance(inputs, Tensor) and inputs.ndim == 2:
        return _given_contexts(inputs, context, wanted)
    bos = _start_token(model)
    limit = None if wanted is None else wanted * (context - 1)
    source, stream = _stream(model, inputs, separator, limit)
    available = stream.numel() // (context - 1)
    if wanted is not None and available < wanted:
        raise ValueError(
            f"the inputs ({source}) hold {stream.numel():,} tokens, {available:,} contexts of "
            f"{context}; {wanted:,} contexts ({wanted * context:,} tokens) were asked for"
        )
    if available == 0:
        raise ValueError(f"the inputs ({source}) hold {stream.numel()} tokens, not one context")
    n_contexts = available if wanted is None else wanted
    stream = stream[: n_contexts * (context - 1)].to(torch.int32).contiguous()
    digest = hashlib.sha256(_int32_bytes(stream)).hexdigest()
    packing = Packing(context, bos, separator, n_contexts, source, digest)
    return PackedContexts(stream, packing)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _contexts_for(n_tokens: Any, context: int) -> int:
    """The contexts that hold `n_tokens` tokens (rounded up), for a positive finite count."""
    number = isinstance(n_tokens, int | float) and not isinstance(n_tokens, bool)
    if not number or not math.isfinite(n_tokens) or n_tokens <= 0:
        raise ValueError(f"n_tokens must be a positive, finite number of tokens, got {n_tokens!r}")
    return -(-math.ceil(n_tokens) // context)


def _start_token(model: Any) -> int:
    tokenizer = getattr(model, "tokenizer", None)
    bos = None if tokenizer is None else tokenizer_of(model).bos_token_id
    if bos is None:
        raise ValueError(
            "packing needs the model's start token, and this model has no tokenizer with a "
            "BOS token; pass ready-made contexts as a 2-D token tensor [batch pos] instead"
        )
    return bos


def _given_contexts(
    tokens: Int[Tensor, "batch pos"], context: int, wanted: int | None
) -> PackedContexts:
    if tokens.dtype.is_floating_point or tokens.shape[1] != context:
        raise ValueError(
            f"a 2-D token tensor is taken as packed contexts [batch pos={context}], got "
            f"{tokens.dtype} of shape {tuple(tokens.shape)}"
        )
    if wanted is not None and tokens.shape[0] < wanted:
        raise ValueError(f"{tokens.shape[0]} contexts given, {wanted} asked for")
    packed = tokens[:wanted].to(torch.int32).contiguous()
    digest = hashlib.sha256(_int32_bytes(packed.reshape(-1))).hexdigest()
    packing = Packing(context, None, None, packed.shape[0], "token tensor", digest)
    return PackedContexts(packed.reshape(-1), packing, packed)


def _stream(
    model: Any, inputs: Any, separator: int | None, limit: int | None
) -> tuple[str, Int[Tensor, " token"]]:
    if inputs is None:
        return DEFAULT_SOURCE, default_corpus()
    documents = [inputs] if isinstance(inputs, str | Path | Tensor | dict) else inputs
    if not isinstance(documents, Iterable):
        raise TypeError(
            f"inputs must be text, a Path, token ids or an iterable of them, got "
            f"{type(inputs).__name__}"
        )
    pieces, total, count = [], 0, 0
    for document in documents:
        if count and separator is not None:
            pieces.append(torch.tensor([separator], dtype=torch.int32))
        ids = _document_ids(model, document)
        pieces.append(ids)
        total += ids.numel()
        count += 1
        if limit is not None and total >= limit:
            break
    if not pieces:
        raise ValueError("the inputs are empty: no document to pack")
    return f"{count} documents", torch.cat(pieces)


def _document_ids(model: Any, document: Any) -> Int[Tensor, " token"]:
    if isinstance(document, dict):
        if "text" not in document:
            raise KeyError(f"a dataset row needs a 'text' field, got fields {sorted(document)}")
        document = document["text"]
    if isinstance(document, Path):
        document = document.read_text(encoding="utf-8")
    if isinstance(document, str):
        return torch.tensor(tokenizer_of(model).encode(document), dtype=torch.int32)
    if isinstance(document, Tensor) and document.ndim == 1 and not document.dtype.is_floating_point:
        return document.to(torch.int32)
    shape = tuple(document.shape) if isinstance(document, Tensor) else ""
    raise TypeError(
        f"a document is a string, a Path, a dict with 'text' or 1-D token ids, got "
        f"{type(document).__name__} {shape}"
    )


def default_corpus() -> Int[Tensor, " token"]:
    """The training split of the standard library's source, as byte tokens (no download)."""
    from hookedattn.training.corpus import load_stdlib_corpus  # read only when asked for

    return load_stdlib_corpus().train.to(torch.int32)


def _int32_bytes(tokens: Int[Tensor, " token"]) -> bytes:
    # safetensors' serialisation is a fast, exact copy of the tensor's bytes (plus a header).
    return safetensors.torch.save({"tokens": tokens.to(torch.int32).contiguous()})
