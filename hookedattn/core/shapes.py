"""The tensors the model passes around, named once with their axes (the glossary of
`hookedattn.core`): what a signature means by a residual stream, a head's queries or the
logits. jaxtyping checks them at test time (`--jaxtyping-packages`), at no cost otherwise.
"""

from jaxtyping import Float
from torch import Tensor

Resid = Float[Tensor, "batch pos d_model"]
"""The residual stream, or anything written to it."""

Logits = Float[Tensor, "batch pos d_vocab_out"]
"""The unembedding's output."""

HeadVectors = Float[Tensor, "batch pos head d_head"]
"""Each query head's q, rotated q or z."""

KeyVectors = Float[Tensor, "batch pos kv_head d_head"]
"""Each key/value head's k or v (one per query head without grouped queries)."""

ValueVectors = Float[Tensor, "batch pos kv_head d_head_v"]
"""Each key/value head's v: `d_head_v` wide, which may differ from `d_head` (MiMo-V2-Flash's
narrower values, latent attention's)."""

Queries = Float[Tensor, "batch query_pos head d_head"]
"""The queries of one attention layer's forward."""

KeyValues = Float[Tensor, "batch key_pos kv_head d_head"]
"""The keys or values every query of a forward may read (a KV cache's past included)."""

Values = Float[Tensor, "batch key_pos kv_head d_head_v"]
"""The values every query of a forward may read; a head's value width `d_head_v` is its
query/key width `d_head` unless `d_head_v` says otherwise (latent attention, MiMo-V2-Flash)."""

HeadOutputs = Float[Tensor, "batch query_pos head d_head_v"]
"""Each query head's `z`: its pattern's mix of the values."""

Scores = Float[Tensor, "batch head query_pos key_pos"]
"""Attention scores, or the pattern after the softmax."""

Normed = Float[Tensor, "batch pos *rest"]
"""What a norm reads and writes: the stream, or per-head queries and keys."""

__all__ = [
    "HeadOutputs",
    "HeadVectors",
    "KeyValues",
    "KeyVectors",
    "Logits",
    "Normed",
    "Queries",
    "Resid",
    "Scores",
    "ValueVectors",
    "Values",
]
