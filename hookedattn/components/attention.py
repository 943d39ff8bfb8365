"""Multi-head causal self-attention, in circuits notation.

Each head h reads the residual stream through `W_Q[h], W_K[h], W_V[h]: [d_model d_head]`
and writes back through `W_O[h]: [d_head d_model]` (row vectors: `q = x @ W_Q[h]`). The
seed worklog's `view(batch, seqlen, heads, d_head).transpose(1, 2)` split is the `head`
axis of these weights: concatenating the heads' `z` and multiplying by one
`[n_heads * d_head, d_model]` matrix is the same as summing `z_h @ W_O[h]` over heads,
which is why each head's write can be read on its own (`hook_result`).

    scores  = q k^T / attn_scale + mask        (hook_attn_scores, the QK circuit; mask: 0 or -inf)
    pattern = softmax over key positions       (hook_pattern)
    z       = pattern @ v                      (hook_z)
    out     = sum_h z_h @ W_O[h] + b_O         (per head: hook_result; the OV circuit)
"""

from einops import einsum, reduce, repeat
from jaxtyping import Float, Int
from torch import Tensor, nn

from hookedattn.components.embed import _param
from hookedattn.components.rotary import Rotary
from hookedattn.config import HookedTransformerConfig
from hookedattn.hook_points import HookPoint
from hookedattn.kv_cache import KeyValueCacheEntry

# Residual-stream input to the projections, shared by all heads or one copy per head
# (use_split_qkv_input / use_attn_in, so that each head's input can be patched alone).
_SHARED_IN = "batch pos d_model, head d_model d_head -> batch pos head d_head"
_PER_HEAD_IN = "batch pos head d_model, head d_model d_head -> batch pos head d_head"

AttnInput = Float[Tensor, "batch pos d_model"] | Float[Tensor, "batch pos head d_model"]


class Attention(nn.Module):
    """One attention sublayer: `n_heads` heads reading and writing the residual stream."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        n_heads, d_model, d_head = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q = _param(n_heads, d_model, d_head, cfg=cfg)
        self.W_K = _param(n_heads, d_model, d_head, cfg=cfg)
        self.W_V = _param(n_heads, d_model, d_head, cfg=cfg)
        self.W_O = _param(n_heads, d_head, d_model, cfg=cfg)
        self.b_Q = _param(n_heads, d_head, cfg=cfg)
        self.b_K = _param(n_heads, d_head, cfg=cfg)
        self.b_V = _param(n_heads, d_head, cfg=cfg)
        self.b_O = _param(d_model, cfg=cfg)
        self.attn_scale = cfg.attn_scale
        per_head_input = cfg.use_split_qkv_input or cfg.use_attn_in
        self._in_pattern = _PER_HEAD_IN if per_head_input else _SHARED_IN

        self.hook_q = HookPoint()  # [batch pos head d_head]
        self.hook_k = HookPoint()
        self.hook_v = HookPoint()
        if cfg.positional_embedding_type == "rotary":
            self.rotary = Rotary(cfg)
            self.hook_rot_q = HookPoint()
            self.hook_rot_k = HookPoint()
            self.apply_positions = self._rotate
        else:
            self.apply_positions = self._unrotated
        self.hook_attn_scores = HookPoint()  # [batch head query_pos key_pos]
        self.hook_pattern = HookPoint()
        self.hook_z = HookPoint()  # [batch pos head d_head]
        if cfg.use_attn_result:
            self.hook_result = HookPoint()  # [batch pos head d_model]
            self.write = self._write_per_head
        else:
            self.write = self._write_summed

    def forward(
        self,
        query_input: AttnInput,
        key_input: AttnInput,
        value_input: AttnInput,
        mask: Float[Tensor, "#batch 1 query_pos key_pos"],
        positions: Int[Tensor, "batch query_pos"],
        past_kv: KeyValueCacheEntry | None = None,
    ) -> Float[Tensor, "batch query_pos d_model"]:
        q = self.hook_q(self.project(query_input, self.W_Q) + self.b_Q)
        k = self.hook_k(self.project(key_input, self.W_K) + self.b_K)
        v = self.hook_v(self.project(value_input, self.W_V) + self.b_V)
        q, k = self.apply_positions(q, k, positions)
        if past_kv is not None:
            k, v = past_kv.append(k, v)
        scores = einsum(
            q / self.attn_scale,  # scaling q is a pass over d_head, not over every key
            k,
            "batch query_pos head d_head, batch key_pos head d_head "
            "-> batch head query_pos key_pos",
        )
        scores = self.hook_attn_scores(scores + mask)
        pattern = self.hook_pattern(scores.softmax(dim=-1))
        z = self.hook_z(
            einsum(
                pattern,
                v,
                "batch head query_pos key_pos, batch key_pos head d_head "
                "-> batch query_pos head d_head",
            )
        )
        return self.write(z)

    def project(
        self, x: AttnInput, W: Float[Tensor, "head d_model d_head"]
    ) -> Float[Tensor, "batch pos head d_head"]:
        """`x @ W[h]` for every head `h`: the heads' queries, keys or values.

        From a shared input, one product over all heads needs `W` laid out as `[d_model
        (head d_head)]`, which einsum copies at every call. For a few tokens (a generation
        step) that copy costs more than the product, so the heads then go as a batch of
        products that read `W` in place, over a broadcast view (not a copy) of `x`: the
        same sums, possibly rounded in another order.
        """
        if self._in_pattern is _SHARED_IN and x.shape[0] * x.shape[1] * 8 <= x.shape[-1]:
            x = repeat(x, "batch pos d_model -> batch pos head d_model", head=W.shape[0])
            return einsum(x, W, _PER_HEAD_IN)
        return einsum(x, W, self._in_pattern)

    def _unrotated(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        return q, k

    def _rotate(self, q: Tensor, k: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        return self.hook_rot_q(self.rotary(q, positions)), self.hook_rot_k(
            self.rotary(k, positions)
        )

    def _write_summed(
        self, z: Float[Tensor, "batch pos head d_head"]
    ) -> Float[Tensor, "batch pos d_model"]:
        return (
            einsum(z, self.W_O, "batch pos head d_head, head d_head d_model -> batch pos d_model")
            + self.b_O
        )

    def _write_per_head(
        self, z: Float[Tensor, "batch pos head d_head"]
    ) -> Float[Tensor, "batch pos d_model"]:
        result = self.hook_result(
            einsum(
                z, self.W_O, "batch pos head d_head, head d_head d_model -> batch pos head d_model"
            )
        )
        return reduce(result, "batch pos head d_model -> batch pos d_model", "sum") + self.b_O
