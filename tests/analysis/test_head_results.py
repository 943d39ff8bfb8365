"""Per-head results and per-source contributions: the seed's A[dest, src] (x W_V + b_V) W_O."""

import itertools

import pytest
import torch

from analysis import (
    SourceContributions,
    head_results,
    head_source_contributions,
    stacked_head_results,
)
from analysis.head_results import head_values
from hookedattn.core.tolerances import tolerance
from hookedattn.testing import random_tiny_model, random_tokens


def _model(norm="LN", use_attn_result=False, dtype=torch.float64, **extra):
    return random_tiny_model(
        n_ctx=8, d_vocab=20, d_mlp=24, normalization_type=norm, use_attn_result=use_attn_result,
        dtype=dtype, **extra,
    )  # fmt: skip


TOKENS = random_tokens(20, batch=2, pos=6, seed=2)


@pytest.mark.parametrize("dtype", (torch.float64, torch.float32))
@pytest.mark.parametrize("norm", ("LN", "RMS", None))
def test_head_results_from_z_equal_hook_result(norm, dtype):
    model = _model(norm, use_attn_result=True, dtype=dtype)
    _, cache = model.run_with_cache(TOKENS)
    _, without_result = model.run_with_cache(
        TOKENS, names_filter=lambda name: not name.endswith("hook_result")
    )
    for layer in range(2):
        cached = head_results(model, cache, layer)
        assert torch.equal(cached, cache["result", layer])
        computed = head_results(model, without_result, layer)
        torch.testing.assert_close(computed, cached, **tolerance(dtype).as_kwargs())


@pytest.mark.parametrize("dtype", (torch.float64, torch.float32))
@pytest.mark.parametrize("use_attn_result", (True, False))
def test_stacked_head_results_are_each_layers_head_results_to_the_bit(use_attn_result, dtype):
    model = _model(use_attn_result=use_attn_result, dtype=dtype)
    _, cache = model.run_with_cache(TOKENS)
    stack = stacked_head_results(model, cache)
    assert stack.shape == (2, 4, 2, 6, model.cfg.d_model) and stack.is_contiguous()
    for layer in range(2):
        by_head = head_results(model, cache, layer).permute(2, 0, 1, 3)
        assert torch.equal(stack[layer], by_head)
        z, W_O = cache["z", layer], model.blocks[layer].attn.W_O.detach()
        dense = torch.einsum("bphd,hdm->hbpm", z, W_O)
        torch.testing.assert_close(stack[layer], dense, **tolerance(dtype).as_kwargs())


@pytest.mark.parametrize("use_attn_result", (True, False))
def test_heads_plus_b_O_sum_to_attn_out(use_attn_result):
    model = _model(use_attn_result=use_attn_result)
    _, cache = model.run_with_cache(TOKENS)
    total = head_results(model, cache, 1).sum(2) + model.blocks[1].attn.b_O.detach()
    torch.testing.assert_close(total, cache["attn_out", 1], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("norm", ("LN", "RMS", None))
def test_source_contributions_follow_the_seed_formula(norm):
    """A[dest, src] * (x[src] @ W_V[h] + b_V[h]) @ W_O[h], x the ln1-normalised stream."""
    model = _model(norm)
    _, cache = model.run_with_cache(TOKENS)
    layer = 1
    attn = model.blocks[layer].attn
    x = model.blocks[layer].ln1(cache["resid_pre", layer]).detach()
    A = cache["pattern", layer]
    contributions = head_source_contributions(model, cache, layer).contributions
    for b, h, dest, src in itertools.product(range(2), range(4), range(6), range(6)):
        value = x[b, src] @ attn.W_V[h].detach() + attn.b_V[h].detach()
        expected = A[b, h, dest, src] * value @ attn.W_O[h].detach()
        torch.testing.assert_close(contributions[b, h, dest, src], expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", (torch.float64, torch.float32))
def test_sources_sum_to_the_head_result(dtype):
    model = _model(dtype=dtype, positional_embedding_type="rotary")
    _, cache = model.run_with_cache(TOKENS)
    contributions = head_source_contributions(model, cache, 0)
    torch.testing.assert_close(
        contributions.sum_sources(), head_results(model, cache, 0), **tolerance(dtype).as_kwargs()
    )


def test_causal_sources_after_the_destination_contribute_nothing():
    model = _model()
    _, cache = model.run_with_cache(TOKENS)
    contributions = head_source_contributions(model, cache, 1, query_pos=2).contributions
    assert contributions.shape == (2, 4, 1, 6, 16)
    assert torch.count_nonzero(contributions[:, :, :, 3:]) == 0


def test_values_are_recomputed_when_hook_v_is_not_cached():
    model = _model("RMS")
    _, cache = model.run_with_cache(TOKENS)
    _, partial = model.run_with_cache(
        TOKENS, names_filter=["blocks.1.hook_resid_pre", "blocks.1.attn.hook_pattern"]
    )
    torch.testing.assert_close(
        head_values(model, partial, 1), cache["v", 1], rtol=1e-12, atol=1e-12
    )
    torch.testing.assert_close(
        head_source_contributions(model, partial, 1).contributions,
        head_source_contributions(model, cache, 1).contributions,
        rtol=1e-12,
        atol=1e-12,
    )


def test_one_destination_top_and_labels():
    model = _model()
    _, cache = model.run_with_cache(TOKENS)
    contributions = head_source_contributions(model, cache, 1, query_pos=[-1])
    assert isinstance(contributions, SourceContributions)
    assert contributions.query_positions == (5,)
    assert torch.equal(contributions["L1H2"], contributions.contributions[:, 2])
    top = contributions.top(3, batch=1)
    norms = contributions.contributions[1, :, 0].norm(dim=-1)
    head, src = divmod(int(norms.argmax()), 6)
    assert top.rows[0][:2] == (f"L1H{head}", src)
    assert top.rows[0][2] == pytest.approx(float(cache["pattern", 1][1, head, 5, src]))
    assert "layer 1" in repr(contributions) and "[5]" in repr(contributions)


def test_memory_guard_and_missing_activations():
    model = _model()
    _, cache = model.run_with_cache(TOKENS)
    with pytest.raises(ValueError, match="max_elements"):
        head_source_contributions(model, cache, 0, max_elements=100)
    _, patterns_only = model.run_with_cache(TOKENS, names_filter="blocks.0.attn.hook_pattern")
    with pytest.raises(KeyError, match="hook_z"):
        head_results(model, patterns_only, 0)
    with pytest.raises(ValueError, match="layer must be"):
        head_results(model, cache, 2)


def test_sources_sum_to_the_head_result_where_values_are_normed():
    # Gemma 4's value norms: the sources carry the normed values, what the heads read.
    model = _model(norm="RMS", use_v_norm=True)
    _, cache = model.run_with_cache(TOKENS)
    contributions = head_source_contributions(model, cache, 1)
    torch.testing.assert_close(contributions.sum_sources(), head_results(model, cache, 1))
    _, partial = model.run_with_cache(TOKENS, names_filter=["blocks.1.hook_resid_pre"])
    with pytest.raises(ValueError, match=r"blocks.1.attn.v_norm.hook_out, which the cache"):
        head_values(model, partial, 1)
