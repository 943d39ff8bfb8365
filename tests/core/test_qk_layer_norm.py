"""LayerNorms of queries and keys (`qk_norm_type="LN"`, Persimmon's, per head) on a tiny
random float64 model: the scores against a brute-force reference (LayerNorm with gain and
bias by hand, the rotation of halves written out), the residual identities, the KV cache,
and the analysis that reads the norms as RMSNorms refusing by name.
"""

import pytest
import torch
from helpers.generation import greedy_with_and_without_cache
from helpers.scores import assert_causal_scores

from analysis.qk_attribution import qk_attribution
from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.testing import assert_residual_identities, randomize_parameters

TOKENS = torch.tensor([[3, 17, 22, 8, 8, 29, 11], [9, 1, 12, 12, 33, 7, 2]])


def model() -> HookedTransformer:
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=24, n_ctx=32, d_vocab=40, n_heads=4, d_head=6, d_mlp=32,
        act_fn="relu", positional_embedding_type="rotary", rotary_base=100.0,
        use_qk_norm=True, qk_norm_type="LN", seed=0, dtype="float64",
    )  # fmt: skip
    return randomize_parameters(HookedTransformer(cfg), seed=7)


def layer_norm(x: torch.Tensor, gain: torch.Tensor, bias: torch.Tensor, eps: float):
    centred = x - x.mean()
    return centred / torch.sqrt((centred * centred).mean() + eps) * gain + bias


def rotated(x: torch.Tensor, position: int, base: float) -> torch.Tensor:
    """Dimension i with i + d/2 by position * base^(-2i/d) (frequencies in float32, angles in
    `x`'s dtype, as ours)."""
    half, out = x.shape[-1] // 2, x.clone()
    for i in range(half):
        frequency = 1.0 / torch.tensor(base, dtype=torch.float32) ** torch.tensor(i / half)
        angle = position * frequency.to(x.dtype)
        cos, sin = torch.cos(angle).to(x.dtype), torch.sin(angle).to(x.dtype)
        out[i], out[i + half] = x[i] * cos - x[i + half] * sin, x[i + half] * cos + x[i] * sin
    return out


def test_scores_read_queries_and_keys_layer_normed_per_head_then_rotated():
    m = model()
    _, cache = m.run_with_cache(TOKENS)
    attn, cfg = m.blocks[1].attn, m.cfg
    qw, qb, kw, kb = (p.detach() for p in (attn.q_norm.w, attn.q_norm.b, attn.k_norm.w,
                                           attn.k_norm.b))  # fmt: skip
    assert qb.abs().sum() > 0  # a bias that is not zero, so a lost one shows
    q, k = cache["blocks.1.attn.hook_q"], cache["blocks.1.attn.hook_k"]
    assert_causal_scores(
        cache, 1,
        lambda b, h, i: rotated(layer_norm(q[b, i, h], qw, qb, cfg.eps), i, 100.0),
        lambda b, h, j: rotated(layer_norm(k[b, j, h], kw, kb, cfg.eps), j, 100.0),
        cfg.attn_scale,
    )  # fmt: skip


def test_residual_identities_hold():
    m = model()
    assert_residual_identities(m, m.run_with_cache(TOKENS)[1])


def test_generation_with_the_kv_cache_equals_recomputing():
    assert torch.equal(*greedy_with_and_without_cache(model(), TOKENS[:1, :4]))


def test_an_unknown_qk_norm_type_names_the_valid_ones():
    with pytest.raises(ValueError, match="RMS"):
        HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=8, d_vocab=8, n_heads=2, d_mlp=8,
                                use_qk_norm=True, qk_norm_type="LayerNorm")  # fmt: skip


def test_qk_attribution_refuses_layer_normed_queries_by_name():
    m = model()
    _, cache = m.run_with_cache(TOKENS)
    with pytest.raises(ValueError, match="qk_norm_type='LN'"):
        qk_attribution(m, cache, layer=1, head=0, query_pos=3, key_pos=1)
