"""Every analysis on every family's block shape, with its identity exact in float64.

The shapes are those of tests/helpers/families.py. Each test states the identity the
analysis promises and checks it against the cached forward (or refuses by name where the
analysis does not apply).
"""

import dataclasses

import pytest
import torch
from einops import einsum, repeat
from helpers.families import FAMILIES, TOKENS, family_model, family_run

from analysis import (
    apply_ln_to_stack,
    composition_scores,
    copying_scores,
    decompose_resid,
    detect_head,
    direct_logit_attribution,
    full_ov_circuit,
    full_qk_circuit,
    head_source_contributions,
    logit_lens,
    qk_circuit,
)
from analysis.head_results import head_writes
from hookedattn.core.kv_cache import KeyValueCache
from hookedattn.core.tolerances import tolerance
from hookedattn.testing import assert_residual_identities

TOL = tolerance(torch.float64).as_kwargs()


@pytest.mark.parametrize("name", FAMILIES)
def test_every_identity_of_the_family_holds_and_none_is_skipped(name):
    model, _, cache = family_run(name)
    check = assert_residual_identities(model, cache)
    assert check.skipped == ()
    statements = " ".join(check.checked)
    assert "unembed.hook_out" in statements
    if model.cfg.normalization_placement != "pre":
        assert "blocks.1.ln2_post(" in statements
    if model.cfg.gated_mlp:
        assert "hook_pre_linear" in statements


@pytest.mark.parametrize(
    ("name", "param", "breaks"),
    [
        ("gemma2", "blocks.0.ln1_post.w", "blocks.0.hook_attn_out == blocks.0.ln1_post("),
        ("olmo2", "blocks.1.attn._W_K", "blocks.1.attn.hook_k == blocks.1.hook_resid_pre @"),
        ("qwen3", "blocks.0.attn.k_norm.w", "blocks.0.attn.k_norm.hook_out =="),
        ("llama", "blocks.1.mlp.W_gate", "blocks.1.mlp.hook_pre == blocks.1.ln2.hook_out"),
    ],
)
def test_a_weight_changed_after_the_forward_breaks_the_identity_that_reads_it(name, param, breaks):
    model = family_model(name)
    _, cache = model.run_with_cache(TOKENS)
    with torch.no_grad():
        model.get_parameter(param).mul_(1.01)
    with pytest.raises(AssertionError, match=r"\[1\] " + breaks.replace("(", r"\(")):
        assert_residual_identities(model, cache)


def test_a_soft_cap_left_out_breaks_the_scores_identity():
    model = family_model("gemma2")
    _, cache = model.run_with_cache(TOKENS)
    model.cfg = dataclasses.replace(model.cfg, attn_scores_soft_cap=None)  # what it checks
    with pytest.raises(AssertionError, match=r"hook_attn_scores == .* / attn_scale \(unmasked"):
        assert_residual_identities(model, cache)


def _points(model):
    points = [("resid_pre", 1), ("resid_post", 0), ("resid_post", None)]
    return points if model.cfg.parallel_attn_mlp else [*points, ("resid_mid", 1)]


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("granularity", ("sublayer", "head", "neuron"))
def test_decompositions_sum_to_the_stream_and_through_its_norm(name, granularity):
    model, _, cache = family_run(name)
    for site, layer in _points(model):
        decomposition = decompose_resid(model, cache, layer, site, granularity, check=True)
        torch.testing.assert_close(decomposition.sum(), cache[decomposition.hook_name], **TOL)
        normed = apply_ln_to_stack(model, cache, decomposition, check=True)
        assert normed.components.shape[0] >= len(decomposition)


def test_a_parallel_block_has_no_resid_mid_to_decompose():
    model, _, cache = family_run("neox")
    with pytest.raises(ValueError, match="parallel block .* no resid_mid"):
        decompose_resid(model, cache, 0, "resid_mid")


def test_the_mlp_norm_of_a_parallel_block_reads_resid_pre_too():
    model, _, cache = family_run("neox")
    decomposition = decompose_resid(model, cache, 1, "resid_pre", "head")
    normed = apply_ln_to_stack(model, cache, decomposition, which="ln2")
    torch.testing.assert_close(normed.sum(), cache["blocks.1.ln2.hook_out"], **TOL)


@pytest.mark.parametrize("name", ["gemma2", "olmo2"])
def test_heads_behind_a_post_norm_write_their_share_at_the_recorded_divisor(name):
    model, _, cache = family_run(name)
    attn = model.blocks[1].attn
    writes = head_writes(model, cache, 1)  # [batch pos head d_model]
    scale = cache["blocks.1.ln1_post.hook_scale"]
    w = model.blocks[1].ln1_post.w.detach()
    bias = attn.b_O.detach() * w / scale
    torch.testing.assert_close(writes.sum(2) + bias, cache["attn_out", 1], **TOL)
    # One head's share is its result through the norm's linear map, not the result alone.
    result = einsum(cache["z", 1], attn.W_O.detach(), "b p h d, h d m -> b p h m")
    torch.testing.assert_close(writes[:, :, 2], result[:, :, 2] * w / scale, **TOL)


@pytest.mark.parametrize("name", FAMILIES)
def test_source_contributions_sum_to_each_heads_write(name):
    model, _, cache = family_run(name)
    contributions = head_source_contributions(model, cache, 0, [2, 8])
    torch.testing.assert_close(
        contributions.sum_sources(), head_writes(model, cache, 0)[:, [2, 8]], **TOL
    )


@pytest.mark.parametrize("name", FAMILIES)
def test_direct_logit_attribution_sums_to_the_logits_before_any_cap(name):
    model, logits, cache = family_run(name)
    decomposition = decompose_resid(model, cache, granularity="neuron")
    attribution = direct_logit_attribution(model, cache, decomposition, TOKENS, 0)
    uncapped = cache["unembed.hook_in"] @ model.W_U.detach() + model.b_U.detach()
    expected = uncapped.gather(-1, TOKENS[..., None])[..., 0] - uncapped[..., 0]
    torch.testing.assert_close(attribution.total(), expected, **TOL)
    cap = model.cfg.output_logits_soft_cap
    assert ("before the soft cap" in attribution.metric) == (cap is not None)
    if cap is not None:  # and the model's logits are the cap of what is attributed
        torch.testing.assert_close(logits, cap * torch.tanh(uncapped / cap), **TOL)


@pytest.mark.parametrize("name", FAMILIES)
def test_the_logit_lens_ends_at_the_models_own_logits(name):
    model, logits, cache = family_run(name)
    lens = logit_lens(model, cache, incl_mid=True)
    torch.testing.assert_close(lens["final"], logits, **TOL)
    assert ("L0_resid_mid" in lens.labels) == (not model.cfg.parallel_attn_mlp)


@pytest.mark.parametrize("name", FAMILIES)
def test_the_ov_circuit_per_query_head_gives_each_heads_write(name):
    """Head h's result (before any post norm) is `sum_src A[q, src] (x[src] OV_h + b_V W_O)`."""
    model, _, cache = family_run(name)
    x = cache[
        "blocks.0.ln1.hook_out" if model.cfg.normalization_placement != "post" else ("resid_pre", 0)
    ]
    OV = model.OV[0].AB.detach()  # [head d_model d_model]
    bias = einsum(model.b_V[0].detach(), model.W_O[0].detach(), "h d, h d m -> h m")
    moved = einsum(x, OV, "b k m, h m n -> b h k n") + bias[None, :, None]
    expected = einsum(cache["pattern", 0], moved, "b h q k, b h k n -> b q h n")
    result = einsum(cache["z", 0], model.W_O[0].detach(), "b p h d, h d m -> b p h m")
    torch.testing.assert_close(result, expected, **TOL)


def test_the_qk_circuit_per_query_head_gives_the_scores_of_a_grouped_model():
    model = family_model("llama", positional_embedding_type="standard", attn_scores_soft_cap=None)
    with torch.no_grad():
        model.blocks[0].attn.b_Q.zero_()
        model.blocks[0].attn._b_K.zero_()
        _, cache = model.run_with_cache(TOKENS)
    x = cache["blocks.0.ln1.hook_out"]
    QK = qk_circuit(model, 0).AB.detach()
    scores = einsum(x, QK, x, "b q m, h m n, b k n -> b h q k") / model.cfg.attn_scale
    blocked = cache["attn_scores", 0].isinf()
    torch.testing.assert_close(cache["attn_scores", 0], scores.masked_fill(blocked, -torch.inf))
    group = model.cfg.n_heads // model.cfg.n_kv_heads
    W_K = repeat(model.blocks[0].attn._W_K, "kv m d -> (kv g) m d", g=group)
    torch.testing.assert_close(model.W_K[0], W_K, rtol=0, atol=0)


@pytest.mark.parametrize("name", ["olmo2", "qwen3"])
def test_qk_circuits_are_refused_by_name_under_qk_norms(name):
    model, _, _ = family_run(name)
    for call in (
        lambda: model.QK,
        lambda: full_qk_circuit(model, 0, 1),
        lambda: composition_scores(model, "K", n_samples=4),
        lambda: copying_scores(model, "QK", n_samples=4),
    ):
        with pytest.raises(ValueError, match="use_qk_norm=True"):
            call()
    assert composition_scores(model, "V", n_samples=4).scores.shape == (2, 4, 2, 4)


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_k_composition_of_grouped_heads_is_that_of_each_query_heads_circuit(name):
    model, _, _ = family_run(name)
    scores = composition_scores(model, "K", n_samples=4).scores
    W_V, W_O, W_Q = model.W_V.detach(), model.W_O.detach(), model.W_Q.detach()
    W_K = model.blocks[1].attn._W_K.detach()
    for head in range(4):  # query heads 2 and 3 read key head 1
        OV = W_V[0, 1] @ W_O[0, 1]
        QK = W_Q[1, head] @ W_K[head // 2].T
        dense = (OV @ QK.T).norm() / (OV.norm() * QK.norm())
        torch.testing.assert_close(scores[0, 1, 1, head], dense, **TOL)


@pytest.mark.parametrize("name", FAMILIES)
def test_head_detectors_score_every_query_head(name):
    model, _, cache = family_run(name)
    scores = detect_head(model, "previous_token", cache)
    pattern = torch.stack([cache["pattern", layer] for layer in range(2)])
    expected = pattern.diagonal(-1, dim1=-2, dim2=-1).mean((1, -1))
    torch.testing.assert_close(scores.scores, expected, **TOL)


def test_heads_that_ignore_their_input_score_their_layers_baseline_in_a_windowed_model():
    model = family_model("gemma2")
    with torch.no_grad():
        for block in model.blocks:  # zero queries: uniform over the keys each layer reaches
            block.attn.W_Q.zero_()
            block.attn.b_Q.zero_()
    scores = detect_head(model, "previous_token", tokens=TOKENS)
    local, full = scores.layer_baselines
    assert full == pytest.approx(scores.baseline) and local > full  # 1/3 beats 1/(q+1)
    for layer, baseline in enumerate(scores.layer_baselines):
        expected = torch.full((4,), baseline, dtype=torch.float64)
        torch.testing.assert_close(scores.scores[layer], expected, **TOL)


def test_the_full_ov_circuit_linearises_the_norm_after_the_attention_too():
    model, _, cache = family_run("gemma2")
    block, W = model.blocks[1], lambda t: t.detach()
    mean = lambda name: cache[name].mean()
    reads = W(model.W_E) * W(block.ln1.w) / mean("blocks.1.ln1.hook_scale")
    writes = W(model.W_O[1, 2]) * W(block.ln1_post.w) / mean("blocks.1.ln1_post.hook_scale")
    unembed = (W(model.ln_final.w) / mean("ln_final.hook_scale"))[:, None] * W(model.W_U)
    expected = reads @ W(model.W_V[1, 2]) @ writes @ unembed
    folded = full_ov_circuit(model, 1, 2, fold_ln_scale=cache)
    torch.testing.assert_close(folded.AB.detach(), expected, **TOL)


def test_identities_hold_when_a_windowed_model_continues_from_its_kv_cache():
    model, _, _ = family_run("gemma2")
    past = KeyValueCache.empty(model.cfg, batch=2)
    with torch.no_grad():
        model(TOKENS[:, :5], past_kv_cache=past)
        _, cache = model.run_with_cache(TOKENS[:, 5:], past_kv_cache=past)
    check = assert_residual_identities(model, cache)
    assert "blocks.0.attn.hook_pattern is 0 on keys 3 or more positions before the query" in (
        check.checked
    )


def test_a_layernorm_after_each_sublayer_adds_its_bias_as_one_more_term():
    model = family_model("neox", normalization_placement="pre_and_post")
    _, cache = model.run_with_cache(TOKENS)
    assert_residual_identities(model, cache)
    decomposition = decompose_resid(model, cache, granularity="neuron", check=True)
    assert {"L1_attn_bias", "L1_ln1_post_bias", "L1_ln2_post_bias"} <= set(decomposition.labels)
    normed = apply_ln_to_stack(model, cache, decomposition, check=True)
    torch.testing.assert_close(normed.sum(), cache["ln_final.hook_out"], **TOL)


@pytest.mark.parametrize("name", ["llama", "olmo2"])
def test_values_recomputed_without_hook_v_are_the_grouped_ones_per_query_head(name):
    model, _, full = family_run(name)
    keep = ("hook_pattern", "hook_resid_pre", "ln1_post.hook_scale")
    _, cache = model.run_with_cache(TOKENS, names_filter=lambda n: n.endswith(keep))
    recomputed = head_source_contributions(model, cache, 1, [4])
    torch.testing.assert_close(
        recomputed.contributions, head_source_contributions(model, full, 1, [4]).contributions
    )
