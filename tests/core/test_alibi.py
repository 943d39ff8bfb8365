"""ALiBi positions (`positional_embedding_type="alibi"`, BLOOM, MPT) on a tiny random float64
model: the slopes and scores against a brute-force reference, padding and the KV cache, the
residual identities, the config's checks and the analysis that refuses the bias by name.
"""

import pytest
import torch
from helpers.generation import greedy_with_and_without_cache

from analysis.qk_attribution import qk_attribution
from hookedattn import HookedTransformer, HookedTransformerConfig, KeyValueCache
from hookedattn.core.components.alibi import alibi_slopes
from hookedattn.testing import assert_residual_identities, randomize_parameters

TOKENS = torch.tensor([[3, 17, 22, 8, 8, 29, 11], [9, 1, 12, 12, 33, 7, 2]])


def model(n_heads: int = 4, **changes) -> HookedTransformer:
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=24, n_ctx=32, d_vocab=40, n_heads=n_heads, d_head=6, d_mlp=32,
        act_fn="gelu", positional_embedding_type="alibi", seed=0, dtype="float64", **changes,
    )  # fmt: skip
    return randomize_parameters(HookedTransformer(cfg), seed=7)


@pytest.mark.parametrize(
    ("n_heads", "exponents"),
    [
        (4, [2, 4, 6, 8]),  # 2^(-8r/4): a power of two takes the sequence as it is
        (8, [1, 2, 3, 4, 5, 6, 7, 8]),
        (6, [2, 4, 6, 8, 1, 3]),  # the 4 of 2^(-8r/4), then odd r of 2^(-8r/8)
        (3, [4, 8, 2]),
    ],
)
def test_slopes_are_the_papers_geometric_sequence(n_heads, exponents):
    expected = torch.tensor([2.0**-e for e in exponents], dtype=torch.float64)
    assert torch.equal(alibi_slopes(n_heads), expected)


def test_scores_are_the_scaled_product_plus_each_heads_slope_times_the_distance():
    m = model(n_heads=6, alibi_slopes=(0.5, 0.25, 0.125, 0.3, 0.7, 1.5))
    _, cache = m.run_with_cache(TOKENS)
    q, k = cache["blocks.1.attn.hook_q"], cache["blocks.1.attn.hook_k"]
    scores = cache["blocks.1.attn.hook_attn_scores"]
    slopes = m.cfg.alibi_slopes
    for b in range(TOKENS.shape[0]):
        for h in range(6):
            for i in range(TOKENS.shape[1]):
                for j in range(i + 1):
                    dot = sum(float(q[b, i, h, d]) * float(k[b, j, h, d]) for d in range(6))
                    expected = dot / m.cfg.attn_scale + slopes[h] * (j - i)
                    assert abs(float(scores[b, h, i, j]) - expected) < 1e-12


def test_a_left_padded_prompt_equals_the_prompt_alone():
    m = model()
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), TOKENS[:1]], dim=1)
    mask = torch.cat([torch.zeros(1, 3), torch.ones(1, TOKENS.shape[1])], dim=1).long()
    got = m(padded, attention_mask=mask)[:, 3:]
    torch.testing.assert_close(got, m(TOKENS[:1]), rtol=0, atol=1e-12)


def test_the_kv_cache_offsets_the_new_queries_after_its_keys():
    m = model()
    cache = KeyValueCache.empty(m.cfg, batch=2)
    first = m(TOKENS[:, :4], past_kv_cache=cache)
    rest = [m(TOKENS[:, i : i + 1], past_kv_cache=cache) for i in range(4, TOKENS.shape[1])]
    torch.testing.assert_close(torch.cat([first, *rest], dim=1), m(TOKENS), rtol=0, atol=1e-12)


def test_a_kv_cache_step_after_a_left_padded_prompt_reads_real_positions():
    m = model()
    padded = torch.cat([torch.zeros(1, 3, dtype=torch.long), TOKENS[:1, :5]], dim=1)
    mask = torch.cat([torch.zeros(1, 3), torch.ones(1, 5)], dim=1).long()
    cache = KeyValueCache.empty(m.cfg, batch=1)
    m(padded, attention_mask=mask, past_kv_cache=cache)
    step = m(
        TOKENS[:1, 5:7], attention_mask=torch.ones(1, 2, dtype=torch.long), past_kv_cache=cache
    )
    torch.testing.assert_close(step, m(TOKENS[:1, :7])[:, 5:], rtol=0, atol=1e-12)


def test_generation_with_the_kv_cache_equals_recomputing():
    assert torch.equal(*greedy_with_and_without_cache(model(), TOKENS[:1, :4]))


def test_residual_identities_hold():
    m = model()
    assert_residual_identities(m, m.run_with_cache(TOKENS)[1])


def test_slopes_without_alibi_are_refused():
    with pytest.raises(ValueError, match="alibi_slopes is set, but positional_embedding_type"):
        HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=8, d_vocab=8, n_heads=2, d_mlp=8,
                                alibi_slopes=(0.5, 0.25))  # fmt: skip


def test_one_slope_per_head_is_required():
    with pytest.raises(ValueError, match="alibi_slopes must be 4 numbers, one per head"):
        model(alibi_slopes=(0.5, 0.25))


def test_an_unknown_positional_type_names_alibi_among_the_valid_ones():
    with pytest.raises(ValueError, match="alibi"):
        HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=8, d_vocab=8, n_heads=2, d_mlp=8,
                                positional_embedding_type="alibis")  # fmt: skip


def test_qk_attribution_refuses_the_bias_by_name():
    m = model()
    _, cache = m.run_with_cache(TOKENS)
    with pytest.raises(ValueError, match="ALiBi's position bias"):
        qk_attribution(m, cache, layer=0, head=1, query_pos=4, key_pos=2)
