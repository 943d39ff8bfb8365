"""Queries and keys normalised after their rotation (`qk_norm_after_rotary`, HunYuan), on a
tiny random float64 model: the scores against a brute-force reference (rotation of halves
written out, RMSNorm per head by hand), the residual identities, and the KV cache.
"""

import torch
from helpers.generation import greedy_with_and_without_cache
from helpers.scores import assert_causal_scores

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.testing import assert_residual_identities, randomize_parameters

TOKENS = torch.tensor([[3, 17, 22, 8, 8, 29, 11], [9, 1, 12, 12, 33, 7, 2]])


def model() -> HookedTransformer:
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=24, n_ctx=32, d_vocab=40, n_heads=4, d_head=6, d_mlp=32,
        act_fn="silu", gated_mlp=True, normalization_type="RMS",
        positional_embedding_type="rotary", rotary_base=100.0, use_qk_norm=True,
        qk_norm_after_rotary=True, seed=0, dtype="float64",
    )  # fmt: skip
    return randomize_parameters(HookedTransformer(cfg), seed=7)


def rotated(x: torch.Tensor, position: int, base: float) -> torch.Tensor:
    """Rotate dimension i with i + d/2 by position * base^(-2i/d), by hand (frequencies in
    float32, as `transformers` computes them; angles and cosines in `x`'s dtype, as ours)."""
    half = x.shape[-1] // 2
    out = x.clone()
    for i in range(half):
        frequency = 1.0 / torch.tensor(base, dtype=torch.float32) ** torch.tensor(
            2 * i / (2 * half)
        )
        angle = position * frequency.to(x.dtype)
        cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
        a, b = x[..., i], x[..., i + half]
        out[..., i] = a * cos - b * sin
        out[..., i + half] = b * cos + a * sin
    return out


def rms(x: torch.Tensor, gain: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + eps) * gain


def test_scores_read_queries_and_keys_normalised_after_the_rotation():
    m = model()
    _, cache = m.run_with_cache(TOKENS)
    attn, cfg = m.blocks[0].attn, m.cfg
    q, k = cache["blocks.0.attn.hook_q"], cache["blocks.0.attn.hook_k"]
    assert_causal_scores(
        cache, 0,
        lambda b, h, i: rms(rotated(q[b, i, h], i, cfg.rotary_base), attn.q_norm.w, cfg.eps),
        lambda b, h, j: rms(rotated(k[b, j, h], j, cfg.rotary_base), attn.k_norm.w, cfg.eps),
        cfg.attn_scale,
    )  # fmt: skip


def test_residual_identities_hold():
    m = model()
    assert_residual_identities(m, m.run_with_cache(TOKENS)[1])


def test_generation_with_the_kv_cache_equals_recomputing():
    assert torch.equal(*greedy_with_and_without_cache(model(), TOKENS[:1, :4]))
