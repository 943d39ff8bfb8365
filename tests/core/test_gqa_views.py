"""Grouped-query attention against its ungrouped twin: every view, analysis and fold.

A grouped model (4 query heads reading 2 key/value heads) computes exactly what an ungrouped
model computes when that one's key and value weights repeat each key/value head for the
query heads of its group: query head `h` reads key/value head `h // 2`. The twin is built
here by an explicit loop over heads (no einops, no `repeat`, nothing of the library's), so it
is an independent reference for the forward, for the per-query-head views (`W_K`, `W_V`,
`b_K`, `b_V`, which circuits read) and for every analysis that reads them. Every weight,
bias and gain is random: a head order swapped inside a group, or a bias read from the wrong
head, changes the answer.
"""

import pytest
import torch

from analysis import (
    composition_scores,
    decompose_resid,
    full_ov_circuit,
    full_qk_circuit,
    head_source_contributions,
)
from analysis.head_results import head_values
from hookedattn import HookedTransformer, fold_value_biases, process_weights
from hookedattn.testing import random_tiny_model, random_tokens

TOL = dict(rtol=1e-10, atol=1e-10)
GROUP = 2  # query heads per key/value head
PATHS = {"fused": True, "written_out": False}
SHAPES = {
    "llama_like": dict(
        normalization_type="RMS",
        positional_embedding_type="rotary",
        gated_mlp=True,
        act_fn="silu",
    ),
    "gpt2_like": dict(act_fn="gelu"),
}


def twins(path: str = "fused", **overrides) -> tuple[HookedTransformer, HookedTransformer]:
    """A random grouped model and its ungrouped twin (key/value heads repeated by a loop)."""
    fields = dict(n_heads=4, use_fused_kernels=PATHS[path], **overrides)
    grouped = random_tiny_model(n_key_value_heads=4 // GROUP, **fields)
    state = {}
    for name, tensor in grouped.state_dict().items():
        if ".attn._" in name:  # _W_K, _W_V, _b_K, _b_V: one per key/value head
            name = name.replace(".attn._", ".attn.")
            tensor = torch.stack([tensor[h // GROUP] for h in range(4)])
        state[name] = tensor
    ungrouped = HookedTransformer(grouped.cfg.replace(n_key_value_heads=None))
    ungrouped.load_state_dict(state)
    return grouped, ungrouped


TOKENS = random_tokens(32, batch=2, pos=9, seed=7)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("shape", SHAPES)
def test_a_grouped_model_computes_what_its_ungrouped_twin_does(shape, path):
    grouped, ungrouped = twins(path, **SHAPES[shape])
    torch.testing.assert_close(grouped(TOKENS), ungrouped(TOKENS), **TOL)


@pytest.mark.parametrize("shape", SHAPES)
def test_the_per_query_head_weights_repeat_each_key_value_head_for_its_group(shape):
    grouped, ungrouped = twins(**SHAPES[shape])
    for name in ("W_K", "W_V", "b_K", "b_V"):
        torch.testing.assert_close(getattr(grouped, name), getattr(ungrouped, name), **TOL)
        for block, twin in zip(grouped.blocks, ungrouped.blocks, strict=True):
            assert torch.equal(getattr(block.attn, name), getattr(twin.attn, name)), name


def test_cached_keys_and_values_are_one_per_key_value_head_and_the_twins_per_query_head():
    grouped, ungrouped = twins(**SHAPES["llama_like"])
    _, cache = grouped.run_with_cache(TOKENS)
    _, twin = ungrouped.run_with_cache(TOKENS)
    for name in ("rot_k", "v"):
        ours = cache[name, 1]
        assert ours.shape[2] == 2
        for h in range(4):
            torch.testing.assert_close(ours[:, :, h // GROUP], twin[name, 1][:, :, h], **TOL)


@pytest.mark.parametrize("shape", SHAPES)
def test_qk_and_ov_circuits_are_the_twins(shape):
    grouped, ungrouped = twins(**SHAPES[shape])
    torch.testing.assert_close(grouped.QK.AB, ungrouped.QK.AB, **TOL)
    torch.testing.assert_close(grouped.OV.AB, ungrouped.OV.AB, **TOL)
    for circuit in (full_qk_circuit, full_ov_circuit):
        torch.testing.assert_close(circuit(grouped, 1).AB, circuit(ungrouped, 1).AB, **TOL)


@pytest.mark.parametrize("kind", ["K", "V"])
def test_composition_scores_are_the_twins(kind):
    grouped, ungrouped = twins(**SHAPES["gpt2_like"])
    ours = composition_scores(grouped, kind, n_samples=4).scores
    torch.testing.assert_close(ours, composition_scores(ungrouped, kind, n_samples=4).scores, **TOL)


@pytest.mark.parametrize("cached", ["hook_v", "resid_pre only"])
def test_head_values_are_the_twins_whether_read_or_recomputed(cached):
    grouped, ungrouped = twins(**SHAPES["gpt2_like"])
    keep = ("hook_v", "hook_resid_pre") if cached == "hook_v" else ("hook_resid_pre",)
    _, cache = grouped.run_with_cache(TOKENS, names_filter=lambda n: n.endswith(keep))
    _, twin = ungrouped.run_with_cache(TOKENS, names_filter=lambda n: n.endswith(keep))
    torch.testing.assert_close(
        head_values(grouped, cache, 1), head_values(ungrouped, twin, 1), **TOL
    )


def test_source_contributions_are_the_twins():
    grouped, ungrouped = twins(**SHAPES["llama_like"])
    _, cache = grouped.run_with_cache(TOKENS)
    _, twin = ungrouped.run_with_cache(TOKENS)
    ours = head_source_contributions(grouped, cache, 1, [3, 8])
    theirs = head_source_contributions(ungrouped, twin, 1, [3, 8])
    torch.testing.assert_close(ours.contributions, theirs.contributions, **TOL)


def test_a_per_head_decomposition_is_the_twins():
    grouped, ungrouped = twins(**SHAPES["llama_like"])
    _, cache = grouped.run_with_cache(TOKENS)
    _, twin = ungrouped.run_with_cache(TOKENS)
    ours = decompose_resid(grouped, cache, granularity="head", check=True)
    theirs = decompose_resid(ungrouped, twin, granularity="head", check=True)
    assert ours.labels == theirs.labels
    torch.testing.assert_close(ours.components, theirs.components, **TOL)


def test_folding_value_biases_sums_each_key_value_heads_bias_over_its_group():
    grouped, ungrouped = twins(**SHAPES["gpt2_like"])
    folded, folded_twin = fold_value_biases(grouped), fold_value_biases(ungrouped)
    torch.testing.assert_close(folded(TOKENS), grouped(TOKENS), **TOL)
    torch.testing.assert_close(folded.b_O, folded_twin.b_O, **TOL)
    assert torch.equal(folded.b_V, torch.zeros_like(folded.b_V))


def test_processed_weights_are_the_twins():
    grouped, ungrouped = twins(**SHAPES["gpt2_like"])
    processed, processed_twin = process_weights(grouped), process_weights(ungrouped)
    torch.testing.assert_close(processed(TOKENS), processed_twin(TOKENS), **TOL)
    for name in ("W_K", "W_V", "b_K", "W_Q", "W_O", "b_O"):
        torch.testing.assert_close(
            getattr(processed, name), getattr(processed_twin, name), **TOL, msg=name
        )
