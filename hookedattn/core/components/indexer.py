"""A lightning indexer: which keys each query reads (DeepSeek V3.2's sparse attention, DSA).

Beside latent attention a small scorer of its own ranks every key a query may read, and the
attention then reads only the `index_topk` best. Its queries come from the attention's
query latent (or the stream, without one), its one key per position from the stream; each
of `index_n_heads` heads scores with a ReLU, and a weight per head and query (read from the
stream) adds the heads up:

    q_I     = rot(c_q @ W_IQ[i])                  (hook_index_q) [batch pos index_head d_index]
    k_I     = rot(LN(x @ W_IK))                   (hook_index_k) [batch pos d_index]
    w       = x @ W_IW                            (hook_index_weights) [batch pos index_head]
    s[t, u] = sum_i w[t, i] relu(q_I[t, i] . k_I[u] / sqrt(d_index)) / sqrt(index_n_heads),
              blocked keys -inf
                                          (hook_index_scores) [batch query_pos key_pos]
    chosen  = the index_topk keys of highest s per query (all it may read, if fewer)
    the attention's blocked keys |= the keys not chosen   (its equation unchanged)

`rot` rotates the first `rotary_dim` dimensions of each head with the attention's own
rotary (DeepSeek V3.2 rotates them as two halves, as ours does; GLM-MoE-DSA in interleaved
pairs, which the import reorders: `hf._indexer`); `LN` is a LayerNorm with gain and bias
over `d_index`, epsilon `index_norm_eps`.

The scores are computed in float32 whatever the model's dtype, as `transformers` computes
them (DeepSeek's reference uses an fp8 kernel): only their order matters, and the same
order makes the same choice. The choice is `torch.topk`'s over each query's whole row
(later keys -inf), ties included: keys tied at the last place (several whose every head's
score the ReLU zeroes) are chosen as `torch.topk` chooses, which is what `transformers`
calls on the same row. `torch.topk` does not promise one choice among ties for a row alone
and for the same row among others, so under such a tie a step with the KV cache may choose
otherwise than the whole forward (in `transformers` as here). The selection is not
differentiable: no gradient reaches the indexer's weights.

A forward with a KV cache keeps the indexer's keys in the layer's entry beside the
attention's (`KeyValueCacheEntry.side`), so a generated token scores every earlier key.
"""

import dataclasses
import math

import torch
from einops import einsum, rearrange
from jaxtyping import Bool, Float
from torch import Tensor, nn

from hookedattn.core.components.embed import _param
from hookedattn.core.components.norm import LayerNorm
from hookedattn.core.components.rotary import Rotary
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.kernels import AttentionContext
from hookedattn.core.kv_cache import KeyValueCacheEntry

Stream = Float[Tensor, "batch pos d_model"]
Scores = Float[Tensor, "batch query_pos key_pos"]


class Indexer(nn.Module):
    """The lightning indexer of one latent attention layer (module docstring)."""

    def __init__(self, cfg: HookedTransformerConfig, attn_type: str = "global") -> None:
        super().__init__()
        n_index, d_index = cfg.index_n_heads, cfg.index_head_dim
        d_query = cfg.d_model if cfg.q_lora_rank is None else cfg.q_lora_rank
        self.topk, self.attn_type = cfg.index_topk, attn_type
        self.W_IQ = _param(n_index, d_query, d_index, cfg=cfg)
        self.W_IK = _param(cfg.d_model, d_index, cfg=cfg)
        self.k_norm = LayerNorm(cfg, (d_index,))
        self.k_norm.eps = cfg.index_norm_eps
        self.W_IW = _param(cfg.d_model, n_index, cfg=cfg)
        self.score_scale = 1 / math.sqrt(d_index)
        self.head_scale = 1 / math.sqrt(n_index)
        self.rotary = Rotary(cfg)
        self.hook_index_q = HookPoint()  # [batch pos index_head d_index]
        self.hook_index_k = HookPoint()  # [batch pos d_index]
        self.hook_index_weights = HookPoint()  # [batch pos index_head]
        self.hook_index_scores = HookPoint()  # [batch query_pos key_pos]

    def forward(
        self,
        x: Stream,
        query_input: Float[Tensor, "batch pos d_query"],
        context: AttentionContext,
        past_kv: KeyValueCacheEntry | None = None,
    ) -> AttentionContext:
        """`context` with the keys this layer's queries do not choose blocked too."""
        q, k = self.queries(query_input, context), self.keys(x, context)
        if past_kv is not None:
            k = past_kv.side("indexer", k[:, :, None])[:, :, 0]
        scores = self.hook_index_scores(self.scores(q, k, self.head_weights(x), context))
        n_chosen = min(self.topk, scores.shape[-1])
        chosen = torch.zeros_like(scores, dtype=torch.bool)
        chosen.scatter_(-1, scores.topk(n_chosen, dim=-1).indices, True)
        return _restricted(context, self.attn_type, ~chosen[:, None])

    def head_weights(self, x: Stream) -> Float[Tensor, "batch pos index_head"]:
        """`x @ W_IW`, each head's weight per query, in float32 at least (`transformers`
        keeps this projection in float32 in a lower-precision model)."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        weights = einsum(
            x.to(dtype), self.W_IW.to(dtype),
            "batch pos d_model, d_model index_head -> batch pos index_head",
        )  # fmt: skip
        return self.hook_index_weights(weights)

    def queries(
        self, query_input: Float[Tensor, "batch pos d_query"], context: AttentionContext
    ) -> Float[Tensor, "batch pos index_head d_index"]:
        """Each index head's rotated query."""
        q = einsum(
            query_input,
            self.W_IQ,
            "batch pos d_query, index_head d_query d_index -> batch pos index_head d_index",
        )
        return self.hook_index_q(self.rotary(q, context.positions))

    def keys(self, x: Stream, context: AttentionContext) -> Float[Tensor, "batch pos d_index"]:
        """The one rotated key per position, normed before the rotation."""
        k = self.k_norm(
            einsum(x, self.W_IK, "batch pos d_model, d_model d_index -> batch pos d_index")
        )
        k = self.rotary(rearrange(k, "batch pos d_index -> batch pos 1 d_index"), context.positions)
        return self.hook_index_k(rearrange(k, "batch pos 1 d_index -> batch pos d_index"))

    def scores(
        self,
        q: Float[Tensor, "batch query_pos index_head d_index"],
        k: Float[Tensor, "batch key_pos d_index"],
        weights: Float[Tensor, "batch query_pos index_head"],
        context: AttentionContext,
    ) -> Scores:
        """`sum_i w[t, i] relu(q_I[t, i] . k_I[u] / sqrt(d_index))` with `w` the head
        weights over `sqrt(index_n_heads)`, in float32, each blocked key's -inf."""
        per_head = einsum(
            q.float(),
            k.float(),
            "batch query_pos index_head d_index, batch key_pos d_index "
            "-> batch query_pos index_head key_pos",
        )
        per_head = torch.relu(per_head * self.score_scale)
        scores = einsum(
            weights.float() * self.head_scale,
            per_head,
            "batch query_pos index_head, batch query_pos index_head key_pos "
            "-> batch query_pos key_pos",
        )
        if context.reads_every_key(self.attn_type):
            return scores
        blocked = context.blocked[self.attn_type][:, 0]
        return scores.masked_fill(blocked, -torch.inf)


def _restricted(
    context: AttentionContext, kind: str, unchosen: Bool[Tensor, "batch 1 query_pos key_pos"]
) -> AttentionContext:
    """`context` whose `kind` of attention also blocks the keys `unchosen`: a mask of this
    layer's own, so that no fused kernel takes the context's plain causal one instead."""
    blocked = dict(context.blocked)
    blocked[kind] = context.blocked[kind] | unchosen
    plain = {other: how for other, how in context.plain.items() if other != kind}
    return dataclasses.replace(context, blocked=blocked, plain=plain, _additive={})
