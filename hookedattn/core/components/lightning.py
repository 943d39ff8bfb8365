"""Lightning attention (Qin et al. 2024, "Lightning Attention-2"; MiniMax-01's linear
attention layers): a sublayer that mixes positions by linear attention with a fixed decay
per head, in place of softmax attention (MiniMax).

From the normed stream `x`, per position (`n_ssm_heads` heads, queries, keys and values
all `d_ssm_head` wide, `lambda_h = decay_rate[h] > 0`):

    q, k, v = silu(x @ W_q + b_q), silu(x @ W_k + b_k), silu(x @ W_v + b_v)
    o_t     = sum_{s <= t} exp(-lambda_h (t - s)) (q_t . k_s) v_s          per head h
    out     = (sigmoid(x @ W_gate + b_gate) * rmsnorm(o) * w_norm) @ W_out + b_out

the norm over all heads' channels together (`d_inner`), its epsilon `ssm_norm_eps`. No
softmax and no scaling of the scores: each pair of positions is weighed by the plain dot
product, decayed by its distance. MiniMax computes `o` in blocks (a state `K^T V` carried
from block to block); the sum is the same, written here as one decayed causal product
(`hook_pattern`: each head's `exp(-lambda (t - s)) q_t . k_s`), as attention's pattern is.
A padding position's keys and values are zero: it writes nothing any query reads. With a
cache (`kv_cache.MixerCacheEntry`) the cache keeps every position's keys and values, as
attention's does, and a forward's queries are its own positions'.

`lightning_decay_float32`: the decays are computed in float32 whatever the dtype, as
`transformers` builds MiniMax's decay tables, once, when it builds the model (a float64
copy keeps their float32 values). Within one of its blocks (256 positions) each decay is
then its table's entry exactly; across blocks it multiplies float32 entries of two tables
and a float64 one, which agrees with this to float32's rounding only.
"""

import torch
from einops import einsum, rearrange
from jaxtyping import Float
from torch import Tensor, nn
from torch.nn.functional import sigmoid, silu

from hookedattn.core.components.causal_conv import real_positions
from hookedattn.core.components.embed import _param, affine, affine_params
from hookedattn.core.components.norm import rms_normalized
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.kernels import AttentionContext
from hookedattn.core.kv_cache import NO_PAST, MixerCacheEntry
from hookedattn.core.shapes import Resid

Heads = Float[Tensor, "batch pos ssm_head d_ssm_head"]
Pattern = Float[Tensor, "batch ssm_head query_pos key_pos"]


def decayed_causal_pattern(
    q: Float[Tensor, "batch query_pos ssm_head d_ssm_head"],
    k: Float[Tensor, "batch key_pos ssm_head d_ssm_head"],
    decay_rate: Float[Tensor, " ssm_head"],
    dtype: torch.dtype,
) -> Pattern:
    """`exp(-lambda (t - s)) q_t . k_s` for `s <= t`, zero above the diagonal; the decays
    computed in `dtype`. The queries are those of the last positions (all of them, or the
    new ones after a cache's)."""
    n_keys = k.shape[1]
    keys = torch.arange(n_keys, device=q.device)
    queries = keys[n_keys - q.shape[1] :]
    distance = (queries[:, None] - keys[None, :]).to(dtype)  # t - s
    rate = decay_rate.to(dtype)
    decay = torch.exp(-einsum(rate, distance, "head, query key -> head query key")).to(q.dtype)
    causal = distance >= 0
    scores = einsum(q, k, "batch query head d, batch key head d -> batch head query key")
    return torch.where(causal, scores * decay, torch.zeros_like(scores))


class LightningAttention(nn.Module):
    """Lightning attention (module docstring). Hook points: `hook_in` (the normed stream
    it reads), `hook_q`, `hook_k`, `hook_v` (per head, after the SiLU), `hook_pattern`
    (the decayed scores), `hook_o` (the heads' reads), `hook_out` (what it writes)."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        m = self.settings = cfg.mixers
        self.hook_in = HookPoint()
        for name in ("q", "k", "v", "gate"):
            W, b = affine_params(cfg.d_model, m.d_inner, cfg)
            setattr(self, f"W_{name}", W)
            setattr(self, f"b_{name}", b)
        self.decay_rate = _param(m.n_ssm_heads, cfg=cfg)
        self.decay_dtype = _float32 if m.lightning_decay_float32 else _dtype_of
        self.hook_q, self.hook_k, self.hook_v = HookPoint(), HookPoint(), HookPoint()
        self.hook_pattern, self.hook_o = HookPoint(), HookPoint()
        self.w_norm = _param(m.d_inner, cfg=cfg)
        self.W_out, self.b_out = affine_params(m.d_inner, cfg.d_model, cfg)
        self.hook_out = HookPoint()

    def forward(
        self, x: Resid, context: AttentionContext, past: MixerCacheEntry = NO_PAST
    ) -> Resid:
        m = self.settings
        x = self.hook_in(x)
        real = real_positions(context, x.shape[1])[..., None]  # a padding key or value is zero
        heads = "batch pos (ssm_head d_ssm_head) -> batch pos ssm_head d_ssm_head"
        q, k, v = (
            rearrange(silu(affine(x, getattr(self, f"W_{n}"), getattr(self, f"b_{n}"))), heads,
                      ssm_head=m.n_ssm_heads)
            for n in "qkv"
        )  # fmt: skip
        q, k, v = self.hook_q(q), self.hook_k(k * real), self.hook_v(v * real)
        k, v = past.rows("k", k), past.rows("v", v)  # every position's (a cache's, then these)
        decays = decayed_causal_pattern(q, k, self.decay_rate, self.decay_dtype(q))
        pattern = self.hook_pattern(decays)
        o = self.hook_o(
            einsum(pattern, v, "batch head query key, batch key head d -> batch query head d")
        )
        o = rearrange(o, "batch pos ssm_head d_ssm_head -> batch pos (ssm_head d_ssm_head)")
        normed = rms_normalized(o, m.ssm_norm_eps) * self.w_norm
        gated = sigmoid(affine(x, self.W_gate, self.b_gate)) * normed
        return self.hook_out(affine(gated, self.W_out, self.b_out))


def _float32(x: Tensor) -> torch.dtype:
    """The dtype of the decays of `lightning_decay_float32`: float32."""
    return torch.float32


def _dtype_of(x: Tensor) -> torch.dtype:
    """The dtype of the decays otherwise: the model's own (`x`'s)."""
    return x.dtype
