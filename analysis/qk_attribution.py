"""Why a head attended where it did: one attention score as query-side × key-side terms.

An attribution graph (`analysis.attribution_graphs`) freezes the attention patterns; this
opens one of them. Head h of layer L scores key position k for query position q as

    score   = cap(q_vec · k_vec / attn_scale)
    q_vec   = rot_q(qnorm(ln1(resid_pre[q]) @ W_Q[h] + b_Q[h]))       (k_vec: W_K, b_K, rot_k)

With the norms' divisors fixed at the values the forward recorded (`ln1`'s `hook_scale`,
and the q/k norms' where `use_qk_norm`), everything before the dot product is linear in
the stream, and the stream is the sum of what wrote into it (`decompose_resid` at
`"head"` granularity: `embed`, `pos_embed`, each earlier head `L0H3`, `L0_attn_bias`, each
earlier MLP `L0_mlp`). So the query is a sum of one vector per writer, plus the norm's bias
`L1_ln1_bias` and `b_Q` as writers of their own (the key likewise, with `b_K`), and

    score_pre_cap = Σ_i Σ_j terms[i, j],   terms[i, j] = q_i · k_j / attn_scale

exactly (to float rounding), each writer centred by LayerNorm on its own, rotated by the
angle of its side's position (rotary is linear), the key read from the query head's group
(`h // group`). `terms[i, j]` is what writer i's query part contributes against writer j's
key part; row sums are what each writer contributes on the query side (against the whole
key), column sums on the key side. Removing writer i from the stream at both positions,
with the divisors still frozen, changes the score by `row_i + column_i - terms[i, i]`.

What is exact, and where it stops:

- A soft-capped model (Gemma 2) decomposes the score before the cap (`score`); the cap
  itself is not linear. `capped_score` is the cached score after it.
- The divisors are this forward's: a term is writer i's share at these divisors, not what
  the score would be with writer i alone (the divisor depends on all writers together).
- Rotary angles are those of positions `0..pos-1`, a forward without padding or a KV
  cache; `check=True` compares the query and key sides with the cached ones and refuses
  a cache recorded otherwise.
- A shortformer's queries and keys read the positional embedding after `ln1`, outside the
  stream: it is one more writer, `pos_embed`, on each side.
- Latent attention (`kv_lora_rank`) reads the stream through latents with norms of their
  own: it is refused.
"""

import dataclasses
from typing import NamedTuple

import torch
from einops import einsum, rearrange, reduce, repeat
from jaxtyping import Float
from torch import Tensor

from analysis._reading import activation, weight
from analysis._resid_stack import check_sums_to, label_index
from analysis.decomposition import decompose_resid
from analysis.normalization import NormSite, through_norm
from analysis.tables import Table
from hookedattn.core.cache import ActivationCache
from hookedattn.core.components.norm import NoNorm
from hookedattn.core.model import HookedTransformer
from hookedattn.core.names import get_act_name

# Each writer's part of a query or key, its side's bias (b_Q or b_K) the last.
WriterVectors = Float[Tensor, "term d_head"]


@dataclasses.dataclass(frozen=True, repr=False)
class QKAttribution:
    """One attention score as a table of query-writer × key-writer terms (module docstring).

    `terms[i, j]`: query-side writer `query_labels[i]` against key-side writer
    `key_labels[j]`; they sum to `score`, the score before any soft cap (for a model
    without a cap, the cached `hook_attn_scores` value). `capped_score` is the cached
    score after the cap, None where the model has none. `layer`, `head`, `query_pos`,
    `key_pos` and `batch` say which score it is.
    """

    terms: Float[Tensor, "query_writer key_writer"]
    query_labels: tuple[str, ...]
    key_labels: tuple[str, ...]
    score: float
    layer: int
    head: int
    query_pos: int
    key_pos: int
    batch: int = 0
    capped_score: float | None = None

    def __post_init__(self) -> None:
        shape = (len(self.query_labels), len(self.key_labels))
        if tuple(self.terms.shape) != shape:
            raise ValueError(f"terms of shape {tuple(self.terms.shape)} for {shape} labels")

    def sum(self) -> float:
        """The sum of every term: `score`, to rounding."""
        return float(self.terms.sum())

    def query_totals(self) -> Float[Tensor, " query_writer"]:
        """Each query-side writer's contribution against the whole key (the row sums)."""
        return reduce(self.terms, "query_writer key_writer -> query_writer", "sum")

    def key_totals(self) -> Float[Tensor, " key_writer"]:
        """Each key-side writer's contribution against the whole query (the column sums)."""
        return reduce(self.terms, "query_writer key_writer -> key_writer", "sum")

    def term(self, query_label: str, key_label: str) -> float:
        """The term of one query-side writer against one key-side writer, by label."""
        i = label_index(self.query_labels, query_label, "query writer")
        j = label_index(self.key_labels, key_label, "key writer")
        return float(self.terms[i, j])

    def top(self, n: int = 10) -> Table:
        """The `n` terms of largest magnitude, with their writers."""
        flat = self.terms.flatten()
        order = flat.abs().argsort(descending=True)[:n].tolist()
        width = len(self.key_labels)
        rows = tuple(
            (self.query_labels[i // width], self.key_labels[i % width], float(flat[i]))
            for i in order
        )
        title = f"the {len(rows)} largest terms of {self._which()}"
        return Table(("query writer", "key writer", "term"), rows, title)

    def totals(self, side: str = "query", n: int | None = None) -> Table:
        """Each writer's total on one side (`"query"`: row sums, `"key"`: column sums),
        largest magnitude first; the `n` largest if given."""
        if side not in ("query", "key"):
            raise ValueError(f"side must be 'query' or 'key', got {side!r}")
        labels, values = (
            (self.query_labels, self.query_totals())
            if side == "query"
            else (self.key_labels, self.key_totals())
        )
        rows = sorted(zip(labels, values.tolist(), strict=True), key=lambda row: -abs(row[1]))
        title = f"{side}-side totals of {self._which()}"
        return Table((f"{side} writer", "total"), tuple(rows[:n]), title)

    def _which(self) -> str:
        return f"L{self.layer}H{self.head}'s score, query {self.query_pos} -> key {self.key_pos}"

    def __repr__(self) -> str:
        cap = (
            "" if self.capped_score is None else f" (before the cap; {self.capped_score:.4g} after)"
        )
        return (
            f"QKAttribution of L{self.layer}H{self.head}, query {self.query_pos} -> key "
            f"{self.key_pos} (batch {self.batch}): score {self.score:.4g}{cap}, "
            f"{len(self.query_labels)} × {len(self.key_labels)} terms"
        )


def qk_attribution(
    model: HookedTransformer,
    cache: ActivationCache,
    layer: int,
    head: int,
    query_pos: int,
    key_pos: int,
    batch: int = 0,
    *,
    check: bool = False,
) -> QKAttribution:
    """The score of head `head` of `layer` from `query_pos` to `key_pos` as writer × writer
    terms (module docstring), the norms' divisors frozen at the cached ones.

    Needs the cache of a full forward (`hook_attn_scores`, the norms' `hook_scale`, what
    `decompose_resid` reads); negative positions count from the end. A key the query cannot
    read (later, outside a window, padding) has no score to decompose: a `ValueError`.
    With `check=True` the query and key sides are compared with the cached queries and keys
    (after any q/k norm and rotation) and the terms with the score, and a
    `DecompositionError` says where they differ beyond rounding.
    """
    where = _where(model, cache, layer, head, query_pos, key_pos, batch)
    stream = decompose_resid(model, cache, where.layer, "resid_pre", "head")
    sides = tuple(
        _StreamWriters(stream.components[:, where.batch, pos], stream.labels)
        for pos in (where.query_pos, where.key_pos)
    )
    return _attribution_of_writers(model, cache, where, sides, check=check)


class _StreamWriters(NamedTuple):
    """Vectors that sum to the residual stream entering a layer at one position, labelled."""

    vectors: Float[Tensor, "writer d_model"]
    labels: tuple[str, ...]


class _Score(NamedTuple):
    """Which score: head `head` of `layer`, from `query_pos` to `key_pos` of batch element
    `batch`, every index checked and non-negative; `cached` its value in the cache."""

    layer: int
    head: int
    query_pos: int
    key_pos: int
    batch: int
    cached: Tensor


def _where(
    model: HookedTransformer,
    cache: ActivationCache,
    layer: int,
    head: int,
    query_pos: int,
    key_pos: int,
    batch: int,
) -> _Score:
    """The score asked for, its indices checked; refused where the query does not read the
    key or the model's attention is not decomposed here."""
    layer = _index(layer, model.cfg.n_layers, "layer")
    model.cfg.require_attention(f"qk_attribution of layer {layer}", [layer])
    head = _index(head, model.cfg.attention_config(layer).n_heads, "head")
    _refuse_unsupported(model)
    scores = activation(cache, ("attn_scores", layer))
    batch = _index(batch, scores.shape[0], "batch")
    query_pos = _index(query_pos, scores.shape[2], "query_pos")
    key_pos = _index(key_pos, scores.shape[3], "key_pos")
    cached = scores[batch, head, query_pos, key_pos]
    if not torch.isfinite(cached):
        readable = torch.isfinite(scores[batch, head, query_pos]).nonzero().flatten().tolist()
        raise ValueError(
            f"query {query_pos} of L{layer}H{head} does not read key {key_pos} (a later "
            f"position, outside its window, or padding): its score is {float(cached)}; "
            f"the keys it reads: {readable}"
        )
    return _Score(layer, head, query_pos, key_pos, batch, cached)


def _attribution_of_writers(
    model: HookedTransformer,
    cache: ActivationCache,
    where: _Score,
    sides: tuple[_StreamWriters, _StreamWriters],
    *,
    check: bool = False,
) -> QKAttribution:
    """The score `where` as the terms of the given writers of the stream at the query's and
    the key's positions (each side's vectors summing to `resid_pre` there): any split of
    the stream, the heads and MLPs of `decompose_resid` or an attribution graph's nodes."""
    layer, head, query_pos, key_pos, batch, cached_score = where
    positions = (query_pos, key_pos)
    attn = model.blocks[layer].attn
    heads = (head, head // attn.group)  # the query head, and the key/value head it reads
    (queries, query_labels), (keys, key_labels) = (
        _side(model, cache, side, layer, heads, batch, pos, writers)
        for side, pos, writers in zip("qk", positions, sides, strict=True)
    )
    terms = einsum(
        queries / attn.attn_scale,  # scaled as the forward scales it: q, before the product
        keys,
        "query_writer d_head, key_writer d_head -> query_writer key_writer",
    )
    capped = not isinstance(attn.soft_cap, NoNorm)
    score = cached_score
    if capped:  # the cache holds the score after the cap
        score = _uncapped_score(model, cache, layer, heads, batch, positions)
    if check:
        _check(model, cache, layer, heads, batch, positions, (queries, keys))
        check_sums_to(
            rearrange(terms, "query_writer key_writer -> (query_writer key_writer) 1 1 1"),
            score.reshape(1, 1, 1),
            f"the terms of L{layer}H{head}'s score from {query_pos} to {key_pos}",
            model.cfg.dtype,
        )
    return QKAttribution(
        terms,
        query_labels,
        key_labels,
        float(score),
        layer,
        head,
        query_pos,
        key_pos,
        batch,
        float(cached_score) if capped else None,
    )


def _index(value: object, size: int, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not -size <= value < size:
        raise ValueError(f"{what} must be an int in 0..{size - 1} (or negative), got {value!r}")
    return value % size


def _refuse_unsupported(model: HookedTransformer) -> None:
    cfg = model.cfg
    if cfg.is_latent_attention:
        raise ValueError(
            f"qk_attribution does not decompose latent attention (kv_lora_rank="
            f"{cfg.kv_lora_rank}): its queries and keys read the stream through latents with "
            f"norms of their own; models with W_Q, W_K per head are supported"
        )
    if cfg.use_qk_norm and cfg.qk_norm_type == "LN":
        raise ValueError(
            "qk_attribution divides each writer by the q/k norms' cached scale, which is "
            "their whole action only for RMSNorms; this model's q/k norms are LayerNorms "
            "(qk_norm_type='LN'), which also centre and add a bias"
        )
    if cfg.positional_embedding_type == "alibi":
        raise ValueError(
            "qk_attribution decomposes q . k / attn_scale into writer terms, but this model "
            "adds ALiBi's position bias slope_h * (key_pos - query_pos) to every score "
            "(positional_embedding_type='alibi'), which no writer contributes; read "
            "model.blocks[layer].attn.alibi.slopes for it"
        )


def _side(
    model: HookedTransformer,
    cache: ActivationCache,
    side: str,
    layer: int,
    heads: tuple[int, int],
    batch: int,
    pos: int,
    writers: _StreamWriters,
) -> tuple[WriterVectors, tuple[str, ...]]:
    """Each writer's part of the query (`side="q"`) or the key (`"k"`) of query head
    `heads[0]` (whose key/value head is `heads[1]`), with their labels: as the attention
    reads it (`_attention_input`), projected (the projection's bias, `b_Q` or
    `b_K`, one more), through the q/k norm at its cached divisor, rotated by `pos`'s angle."""
    head, kv_head = heads
    attn = model.blocks[layer].attn
    normed, labels = _attention_input(model, cache, layer, batch, pos, writers)
    # W_K and b_K show each key/value head once per query head of its group; whole (every
    # head, gathered from a tensor-parallel model's ranks).
    names = ("W_Q", "b_Q") if side == "q" else ("W_K", "b_K")
    W, b = (model.layer_weight(layer, "attn", name) for name in names)
    vectors = einsum(
        normed,
        weight(W[head], normed),
        "stream_writer d_model, d_model d_head -> stream_writer d_head",
    )
    vectors = torch.cat([vectors, weight(b[head], normed)[None]])
    norm = attn.q_norm if side == "q" else attn.k_norm
    if not isinstance(norm, NoNorm):
        index = head if side == "q" else kv_head  # the norm's own head axis
        # Per head: scale [head 1], gain [d_head]; over all heads: scale [1 1], gain [head d_head].
        scale = activation(cache, get_act_name(f"{side}_norm_scale", layer))[batch, pos]
        gain = weight(norm.w, vectors)
        scale = scale[index if scale.shape[0] > 1 else 0]
        vectors = vectors / scale * (gain[index] if gain.ndim == 2 else gain)
    if model.cfg.layer_rotates(layer):
        positions = torch.tensor([[pos]], device=vectors.device)
        cos, sin = attn.rotary.cos_sin(positions, vectors.dtype)
        rotated = attn.rotary.rotate(rearrange(vectors, "term d_head -> term 1 1 d_head"), cos, sin)
        vectors = rearrange(rotated, "term 1 1 d_head -> term d_head")
    return vectors, (*labels, "b_Q" if side == "q" else "b_K")


def _attention_input(
    model: HookedTransformer,
    cache: ActivationCache,
    layer: int,
    batch: int,
    pos: int,
    writers: _StreamWriters,
) -> tuple[Float[Tensor, "term d_model"], tuple[str, ...]]:
    """The writers through `ln1` at its cached divisor, its bias one more writer; in a
    shortformer, the positional embedding the queries and keys read after it, one more."""
    ln1 = NormSite("ln1", layer)
    normed, labels = writers.vectors, writers.labels
    if not isinstance(ln1.module(model), NoNorm):
        n_batch = activation(cache, ln1.hook("scale")).shape[0]
        # The cached divisors are per batch element: the writers repeated over the batch.
        stream = repeat(normed, "writer d_model -> writer batch 1 d_model", batch=n_batch)
        normed, labels = through_norm(model, cache, ln1, stream, labels, positions=[pos])
        normed = normed[:, batch, 0]
    if model.cfg.positional_embedding_type == "shortformer":
        pos_embed = activation(cache, "pos_embed")[batch, pos]  # never in the stream
        normed, labels = torch.cat([normed, pos_embed[None]]), (*labels, "pos_embed")
    return normed, labels


def _cached_vector(
    model: HookedTransformer, cache: ActivationCache, side: str, layer: int, head: int
) -> Float[Tensor, "batch pos d_head"]:
    """The queries (`"q"`, of a query head) or keys (`"k"`, of a key/value head) the scores
    read, as cached: after the rotation, or the q/k norm, or the projection."""
    attn = model.blocks[layer].attn
    if model.cfg.layer_rotates(layer):
        name = f"rot_{side}"
    elif not isinstance(attn.q_norm, NoNorm):
        name = f"{side}_norm_out"
    else:
        name = side
    return activation(cache, get_act_name(name, layer))[:, :, head]


def _uncapped_score(
    model: HookedTransformer,
    cache: ActivationCache,
    layer: int,
    heads: tuple[int, int],
    batch: int,
    positions: tuple[int, int],
) -> Tensor:
    """The score before the soft cap, from the cached queries and keys (the cache holds the
    score after it only)."""
    attn = model.blocks[layer].attn
    query = _cached_vector(model, cache, "q", layer, heads[0])[batch, positions[0]]
    key = _cached_vector(model, cache, "k", layer, heads[1])[batch, positions[1]]
    return einsum(query / attn.attn_scale, key, "d_head, d_head ->")


def _check(
    model: HookedTransformer,
    cache: ActivationCache,
    layer: int,
    heads: tuple[int, int],
    batch: int,
    positions: tuple[int, int],
    sides: tuple[Tensor, Tensor],  # [term d_head] each, a count of its own
) -> None:
    """`DecompositionError` unless each side's writers sum to the cached query or key."""
    for side, head, pos, vectors in zip("qk", heads, positions, sides, strict=True):
        target = _cached_vector(model, cache, side, layer, head)[batch, pos]
        what = f"the {'query' if side == 'q' else 'key'} of L{layer}H{heads[0]} at position {pos}"
        check_sums_to(
            rearrange(vectors, "term d_head -> term 1 1 d_head"),
            target.reshape(1, 1, -1),
            what,
            model.cfg.dtype,
        )
