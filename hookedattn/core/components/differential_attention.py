"""Differential attention (Ye et al. 2024, "Differential Transformer", section 2.1; DiffLlama).

Each output head subtracts one softmax pattern from another, so that attention both
patterns give to irrelevant keys ("attention noise") cancels. The `n_heads` query heads are
ordinary ones (keys and values grouped as usual); they come in pairs, query head `i` and
query head `i + n_heads / 2`, which read the same values, two key/value heads side by side:

    q, k, v    = as any attention (hook_q, hook_k, hook_v, hook_rot_q, hook_rot_k)
    v_pair[j]  = [v[j mod half] | v[j mod half + half]]  half = n_kv_heads / 2: each
                 key/value head's value, 2 d_head wide (as a HF checkpoint pairs them)
    pattern    = softmax of each query head's scores      (hook_attn_scores, hook_pattern)
    z[h]       = pattern[h] @ v_pair[h's key/value head]  (hook_z) [batch pos head 2 d_head]
    lambda     = exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) + lambda_init
    z_diff[i]  = z[i] - lambda z[i + n_heads / 2]          (hook_z_diff) [batch pos pair 2d]
               = (pattern[i] - lambda pattern[i + n_heads / 2]) @ v_pair: the differential
                 pattern `differential_pattern` gives, applied to the pair's values
    z_normed   = (1 - lambda_init) rms(z_diff[i])          (hook_z_normed), per pair, no gain
    out        = sum_i z_normed[i] @ W_O[i] + b_O          (hook_result per pair)

`lambda_init = 0.8 - 0.6 exp(-0.3 layer)` (the paper's schedule over the layer's index,
counted from 0), a constant of the layer; `lambda` one scalar of the layer, learned through
its four `d_head` vectors. The write reads pairs: `W_O: [pair 2 d_head d_model]`, and
`hook_result` has one entry per pair. The norm between `z_diff` and `W_O` divides each pair
by its own scale, so the OV circuit is not one matrix (`model.OV` refuses this attention);
each pair's write is still its own term of the sum.
"""

import math

import torch
from einops import rearrange, repeat
from jaxtyping import Float
from torch import Tensor

from hookedattn.core.components.attention import Attention, GroupedQueryAttention
from hookedattn.core.components.embed import _param
from hookedattn.core.components.norm import RMSNormPre
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hook_points import HookPoint


def lambda_init(layer: int) -> float:
    """The paper's `lambda_init` of layer `layer` (counted from 0): 0.2 at the first layer,
    rising towards 0.8."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


class DifferentialAttention(Attention):
    """Differential attention (module docstring): an attention's queries, keys, patterns
    and `z`, its pairs of heads subtracted, normed and written."""

    def __init__(self, cfg: HookedTransformerConfig, layer: int = 0) -> None:
        super().__init__(cfg, layer)
        d_head, n_pairs = cfg.d_head, cfg.n_heads // 2
        self.lambda_init = lambda_init(layer)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(self, name, _param(d_head, cfg=cfg))
        self.W_O = _param(n_pairs, 2 * d_head, cfg.d_model, cfg=cfg)
        self.hook_z_diff = HookPoint()  # [batch pos pair 2 d_head]
        self.z_norm = RMSNormPre(cfg, (2 * d_head,))
        self.hook_z_normed = HookPoint()  # [batch pos pair 2 d_head]
        # Attention's forward, its write preceded by the pairs' difference and norm.
        self.write_pairs, self.write = self.write, self._write_differential

    def read_values(
        self, v: Float[Tensor, "batch pos kv_head d_head"]
    ) -> Float[Tensor, "batch pos kv_head d_pair"]:
        """Each key/value head's pair of values (`paired_values`): what the heads read."""
        return paired_values(v)

    def _write_differential(
        self, z: Float[Tensor, "batch pos head d_pair"]
    ) -> Float[Tensor, "batch pos d_model"]:
        """`z` (after `hook_z`) to the stream: the pairs subtracted, normed and written."""
        z_diff = self.hook_z_diff(self.differential(z))
        return self.write_pairs(self.hook_z_normed((1 - self.lambda_init) * self.z_norm(z_diff)))

    def lambda_full(self) -> Float[Tensor, ""]:
        """The layer's `lambda`: `exp(lambda_q1 . lambda_k1) - exp(lambda_q2 . lambda_k2) +
        lambda_init`."""
        first = torch.exp(torch.dot(self.lambda_q1, self.lambda_k1))
        second = torch.exp(torch.dot(self.lambda_q2, self.lambda_k2))
        return first - second + self.lambda_init

    def differential(
        self, z: Float[Tensor, "batch pos head d_pair"]
    ) -> Float[Tensor, "batch pos pair d_pair"]:
        """`z[i] - lambda z[i + n_heads / 2]` for each pair `i` of query heads."""
        first, second = rearrange(z, "batch pos (side pair) d -> side batch pos pair d", side=2)
        return first - self.lambda_full().to(z.dtype) * second

    def differential_pattern(
        self, pattern: Float[Tensor, "batch head query_pos key_pos"]
    ) -> Float[Tensor, "batch pair query_pos key_pos"]:
        """`pattern[i] - lambda pattern[i + n_heads / 2]`: the weights each pair's
        `z_diff` gives the keys' paired values (a `hook_pattern` value, read from a cache)."""
        first, second = rearrange(
            pattern, "batch (side pair) query_pos key_pos -> side batch pair query_pos key_pos",
            side=2,
        )  # fmt: skip
        return first - self.lambda_full().to(pattern.dtype) * second


def paired_values(
    v: Float[Tensor, "batch pos kv_head d_head"],
) -> Float[Tensor, "batch pos kv_head d_pair"]:
    """Each key/value head's value `[v[j mod half] | v[j mod half + half]]`: the two halves
    of the key/value heads side by side, repeated for both halves (module docstring)."""
    pairs = rearrange(v, "batch pos (side half) d -> batch pos half (side d)", side=2)
    return repeat(pairs, "batch pos half d -> batch pos (copy half) d", copy=2)


class GroupedDifferentialAttention(DifferentialAttention, GroupedQueryAttention):
    """Differential attention whose query heads share key/value heads in groups: the
    weights stored once per key/value head (`GroupedQueryAttention`)."""


def make_differential_attention(cfg: HookedTransformerConfig, layer: int) -> Attention:
    """The differential attention of block `layer`, grouped where `n_key_value_heads` is
    fewer than `n_heads`."""
    grouped = cfg.n_kv_heads != cfg.n_heads
    return (GroupedDifferentialAttention if grouped else DifferentialAttention)(cfg, layer)
