"""Patching a mixture of experts on the batched engine, against its reference (one forward
per patch, `analysis.patching._reference`): each expert's write (`expert_out`), the router's
logits (a token's, or one logit), the chosen experts, the shared expert's output.

An expert's write has no activation of its own to swap (its rows are the tokens routed to
it, which differ between the runs); the reference patches it inside each forward from that
forward's own rows and routing, the engine from the base runs' (module docstring of
`analysis.patching._experts`): they must agree to 1e-10 in float64.
"""

import pytest
import torch
from helpers.moe import TOKENS, moe_model

from analysis import Component, activation_patch, attribution_patch, available_kinds, path_patch
from analysis.patching._components import component_grid
from analysis.patching._reference import reference_sweep

CORRUPTED = torch.randint(0, 23, TOKENS.shape, generator=torch.Generator().manual_seed(11))
TOL = dict(rtol=0, atol=1e-10)


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 3] - logits[:, -1, 5]


@pytest.fixture(scope="module")
def model():
    return moe_model(d_mlp_shared=10, shared_expert_gate=True, norm_topk_prob=True)


def expected(model, kind, by_pos, direction="denoising", components=None):
    target, source = (CORRUPTED, TOKENS) if direction == "denoising" else (TOKENS, CORRUPTED)
    with torch.no_grad():
        _, cache = model.run_with_cache(source)
    if components is None:
        components = component_grid(model, kind, TOKENS.shape[1], by_pos).components
    return reference_sweep(model, target, cache, components, metric)


@pytest.mark.parametrize("by_pos", [False, True])
@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_patching_each_experts_write_is_one_forward_per_patch(model, by_pos, direction):
    result = activation_patch(
        model, "expert_out", clean_tokens=TOKENS, corrupted_tokens=CORRUPTED, metric=metric,
        by_pos=by_pos, direction=direction,
    )  # fmt: skip
    n_experts = model.cfg.num_experts
    shape = (2, TOKENS.shape[1], n_experts) if by_pos else (2, n_experts)
    assert result.per_prompt.shape == (*shape, 2)
    reference = expected(model, "expert_out", by_pos, direction)
    torch.testing.assert_close(result.per_prompt.reshape(-1, 2), reference, **TOL)
    # Some expert mattered and some did not: not a test that cannot fail.
    change = (result.per_prompt - result.corrupted if direction == "denoising" else
              result.per_prompt - result.clean).abs()  # fmt: skip
    assert float(change.max()) > 1e-3 and float(change.min()) < 1e-12


def test_expert_patching_with_declared_positions_and_a_small_memory_budget(model):
    result = activation_patch(
        model, "expert_out", clean_tokens=TOKENS, corrupted_tokens=CORRUPTED, metric=metric,
        by_pos=True, metric_positions=-1, memory_budget=1,
    )  # fmt: skip
    reference = expected(model, "expert_out", True)
    torch.testing.assert_close(result.per_prompt.reshape(-1, 2), reference, **TOL)


@pytest.mark.parametrize("kind", ["router_logits", "expert_indices", "shared_out"])
def test_routing_and_the_shared_expert_are_patched_as_one_forward_per_patch(model, kind):
    result = activation_patch(
        model, kind, clean_tokens=TOKENS, corrupted_tokens=CORRUPTED, metric=metric
    )
    assert result.axes == ("layer", "pos")
    reference = expected(model, kind, True)
    torch.testing.assert_close(result.per_prompt.reshape(-1, 2), reference, **TOL)


def test_one_router_logit_is_a_component_too(model):
    components = [Component("router_logits", layer, pos=p, expert=e)
                  for layer in (0, 1) for p in (2, 6) for e in (0, 4)]  # fmt: skip
    with torch.no_grad():
        _, clean = model.run_with_cache(TOKENS)
    reference = reference_sweep(model, CORRUPTED, clean, components, metric)
    # The grid patches whole logit vectors; one logit by one must differ from that.
    whole = expected(model, "router_logits", True)
    assert not torch.allclose(reference, whole[: len(components)])
    from analysis.patching._edits import component_edits
    from analysis.patching._inputs import base_runs
    from analysis.patching._sweep import sweep

    runs = base_runs(model, TOKENS, CORRUPTED, metric, [c.hook_name for c in components], None)
    edits = component_edits(components, runs.clean.cache)
    swept = sweep(model, runs.corrupted, edits, len(components), metric)
    torch.testing.assert_close(swept, reference, **TOL)


def test_the_moe_kinds_are_available_and_a_dense_model_says_why_not(model):
    kinds = available_kinds(model)
    assert {"router_logits", "expert_indices", "expert_out", "shared_out"} <= set(kinds)
    dense = moe_model(num_experts=None, experts_per_token=None)
    with pytest.raises(ValueError, match=r"no 'expert_out' \(its MLPs are dense"):
        activation_patch(dense, "expert_out", clean_tokens=TOKENS, corrupted_tokens=CORRUPTED,
                         metric=metric)  # fmt: skip


def test_attribution_patching_skips_what_has_no_gradient_and_refuses_it_by_name(model):
    results = attribution_patch(
        model, clean_tokens=TOKENS, corrupted_tokens=CORRUPTED, metric=metric
    )
    assert "router_logits" in results and "expert_indices" not in list(results)
    with pytest.raises(ValueError, match="attribution patching does not patch 'expert_out'"):
        attribution_patch(model, "expert_out", clean_tokens=TOKENS, corrupted_tokens=CORRUPTED,
                          metric=metric)  # fmt: skip


def test_path_patching_refuses_an_experts_write():
    model = moe_model()
    with pytest.raises(ValueError, match="path patching does not patch 'expert_out'"):
        path_patch(model, Component("resid_post", 1), "expert_out", clean_tokens=TOKENS,
                   corrupted_tokens=CORRUPTED, metric=metric)  # fmt: skip
