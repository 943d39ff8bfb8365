"""Attention with an output gate (`attn_gate`: Qwen3-Next's sigmoid, Laguna's softplus; one
factor per dimension of a head or one per head), on tiny random float64 models: against a
brute-force reference written with loops over heads and positions, the per-head writes
summing to the sublayer's output, the residual identities and the KV cache.
"""

import pytest
import torch
from helpers.generation import greedy_with_and_without_cache

from analysis import decompose_resid
from analysis.head_results import head_source_contributions, head_writes
from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core.processing import fold_value_biases, process_weights
from hookedattn.testing import assert_residual_identities, randomize_parameters

GATED = dict(
    n_layers=2, d_model=24, n_ctx=32, d_vocab=40, n_heads=4, d_head=6, d_mlp=32,
    act_fn="gelu", normalization_type="LN", positional_embedding_type="standard",
    use_attn_result=True, seed=0, dtype="float64",
)  # fmt: skip
VARIANTS = {
    "sigmoid_per_dimension": dict(attn_gate="sigmoid"),
    "softplus_per_head": dict(attn_gate="softplus", attn_gate_per_head=True),
}
TOKENS = torch.tensor([[3, 17, 22, 8, 8, 29, 11], [9, 1, 12, 12, 33, 7, 2]])


@pytest.fixture(scope="module", params=list(VARIANTS))
def model(request) -> HookedTransformer:
    cfg = HookedTransformerConfig(**GATED, **VARIANTS[request.param])
    return randomize_parameters(HookedTransformer(cfg), seed=5)


def brute_force_z(model: HookedTransformer, layer: int, x: torch.Tensor) -> torch.Tensor:
    """Each head's gated output at each position, by loops: `x` is the normed input."""
    attn, cfg = model.blocks[layer].attn, model.cfg
    gate_fn = {"sigmoid": torch.sigmoid, "softplus": torch.nn.functional.softplus}[cfg.attn_gate]
    batch, n_pos, _ = x.shape
    z = torch.zeros(batch, n_pos, cfg.n_heads, cfg.d_head, dtype=x.dtype)
    for b in range(batch):
        for h in range(cfg.n_heads):
            q = x[b] @ attn.W_Q[h] + attn.b_Q[h]
            k = x[b] @ attn.W_K[h] + attn.b_K[h]
            v = x[b] @ attn.W_V[h] + attn.b_V[h]
            for i in range(n_pos):
                scores = torch.stack([q[i] @ k[j] for j in range(i + 1)]) / cfg.attn_scale
                pattern = scores.softmax(dim=0)
                mixed = sum(pattern[j] * v[j] for j in range(i + 1))
                gate = gate_fn(x[b, i] @ attn.W_G[h] + attn.b_G[h])  # [d_head] or [1]
                z[b, i, h] = mixed * gate
    return z


def test_gated_heads_match_a_brute_force_reference(model):
    _, cache = model.run_with_cache(TOKENS)
    for layer in range(model.cfg.n_layers):
        with torch.no_grad():
            x = model.blocks[layer].ln1(cache[f"blocks.{layer}.hook_resid_pre"])
        expected = brute_force_z(model, layer, x)
        assert torch.allclose(cache[f"blocks.{layer}.attn.hook_z"], expected, atol=1e-12)


def test_the_gate_is_cached_with_its_width(model):
    _, cache = model.run_with_cache(TOKENS)
    width = 1 if model.cfg.attn_gate_per_head else model.cfg.d_head
    assert cache["blocks.0.attn.hook_attn_gate"].shape == (*TOKENS.shape, model.cfg.n_heads, width)


def test_each_heads_write_is_its_gated_z_through_W_O(model):
    _, cache = model.run_with_cache(TOKENS)
    attn = model.blocks[1].attn
    result = torch.einsum("bphd,hdm->bphm", cache["blocks.1.attn.hook_z"], attn.W_O)
    assert torch.allclose(cache["blocks.1.attn.hook_result"], result, atol=1e-12)
    summed = result.sum(dim=2) + attn.b_O
    assert torch.allclose(cache["blocks.1.hook_attn_out"], summed, atol=1e-12)


def test_source_contributions_sum_to_each_gated_heads_write(model):
    # Each query's gate scales every value it reads: a source's share is gated too.
    _, cache = model.run_with_cache(TOKENS)
    contributions = head_source_contributions(model, cache, 1, [2, 6])
    expected = head_writes(model, cache, 1)[:, [2, 6]]
    assert torch.allclose(contributions.sum_sources(), expected, atol=1e-12)


def test_the_residual_decomposition_sums_to_the_stream(model):
    _, cache = model.run_with_cache(TOKENS)
    decomposition = decompose_resid(model, cache, granularity="head", check=True)
    assert torch.allclose(decomposition.sum(), cache[decomposition.hook_name], atol=1e-12)


def test_residual_identities_hold(model):
    assert_residual_identities(model, model.run_with_cache(TOKENS)[1])


def test_editing_the_gate_changes_what_the_head_writes(model):
    closed = lambda gate, hook: torch.zeros_like(gate)
    _, cache = model.run_with_cache(TOKENS)
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_attn_gate", closed)]):
        _, shut = model.run_with_cache(TOKENS)
    assert float(shut["blocks.0.attn.hook_z"].abs().max()) == 0.0
    assert float(cache["blocks.0.attn.hook_z"].abs().max()) > 0.0


def test_generation_with_the_kv_cache_equals_recomputing(model):
    assert torch.equal(*greedy_with_and_without_cache(model, TOKENS[:1, :4]))


def test_processing_folds_the_norm_into_the_gate_and_keeps_the_logits(model):
    processed = process_weights(model)
    with torch.no_grad():
        before, after = model(TOKENS), processed(TOKENS)
    shift = (after - before) - (after - before).mean(dim=-1, keepdim=True)  # center_unembed
    assert float(shift.abs().max()) < 1e-10
    assert processed.cfg.normalization_type == "LNPre"


def test_folding_value_biases_is_refused_under_a_gate(model):
    with pytest.raises(ValueError, match="attn_gate"):
        fold_value_biases(model)


def test_latent_attention_gates_each_value_dimension_of_its_narrower_heads():
    # Bailing Hybrid gates its latent attention (one factor per head; the brute force of
    # tests/core/test_latent_attention.py checks it); a per-dimension gate is d_head_v wide.
    model = HookedTransformer(
        HookedTransformerConfig(
            n_layers=1, d_model=16, n_ctx=8, d_vocab=10, n_heads=2, d_head=8, d_head_v=6,
            d_mlp=8, kv_lora_rank=4, positional_embedding_type="rotary", rotary_dim=4,
            attn_gate="sigmoid",
        )
    )  # fmt: skip
    assert model.blocks[0].attn.W_G.shape == (2, 16, 6)
    _, cache = model.run_with_cache(torch.tensor([[1, 2, 3]]))
    assert cache["blocks.0.attn.hook_attn_gate"].shape == (1, 3, 2, 6)
