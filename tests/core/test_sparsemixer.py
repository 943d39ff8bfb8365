"""Phi-3.5-MoE's router (`router_scoring="sparsemixer"`, `components.sparsemixer`) against a
token-by-token loop written from its description (GRIN, arXiv 2409.12136, as transformers
runs it in inference): slot by slot, the best logit not yet chosen, weighed by the softmax
over the logits relatively within `2 * eps` of it among those not chosen before. Float64."""

import math

import pytest
import torch
from helpers.moe import TOKENS, moe_model

from hookedattn import HookedTransformerConfig


def brute_force_route(logits: list[float], k: int, eps: float, forced=None):
    """One token's chosen experts and weights from its logits, with Python floats."""
    taken, chosen, weights = set(), [], []
    for slot in range(k):
        rest = [j for j in range(len(logits)) if j not in taken]
        i = forced[slot] if forced else max(rest, key=lambda j: logits[j])
        r = logits[i]
        near = [j for j in rest if (r - logits[j]) / max(abs(logits[j]), r) <= 2 * eps]
        weights.append(math.exp(r) / sum(math.exp(logits[j]) for j in near))
        chosen.append(i)
        taken.add(i)
    return chosen, weights


def _routes(eps: float, forced=None):
    model = moe_model(router_scoring="sparsemixer", sparsemixer_jitter_eps=eps, num_experts=8)
    moe = model.blocks[0].mlp
    x = torch.randn(2, 9, 16, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    hooks = []
    if forced is not None:
        choice = torch.tensor(forced).expand(2, 9, 2)
        hooks = [("blocks.0.mlp.hook_expert_indices", lambda t, hook: choice.clone())]
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        indices, weights = moe.route(x)
    logits = (x @ moe.W_router + moe.b_router).tolist()
    expected = [[brute_force_route(token, 2, eps, forced) for token in row] for row in logits]
    return indices, weights, expected


@pytest.mark.parametrize("eps", [0.0, 0.01, 0.2, 1.0])
def test_the_routing_is_the_brute_force_loop(eps):
    indices, weights, expected = _routes(eps)
    assert indices.tolist() == [[chosen for chosen, _ in row] for row in expected]
    want = torch.tensor([[w for _, w in row] for row in expected], dtype=torch.float64)
    assert float((weights - want).abs().max()) <= 1e-13


def test_the_epsilon_decides_which_experts_share_each_softmax():
    _, alone, _ = _routes(0.0)  # only the chosen expert is near itself
    _, some, _ = _routes(0.2)
    _, everyone, _ = _routes(1e9)  # the plain softmax over the experts left
    assert torch.equal(alone, torch.ones_like(alone))
    assert bool(((some < 1) & (some > everyone)).any()) and bool((some == 1).any())
    assert bool((everyone < 1).all())


def test_an_edited_choice_is_weighed_against_its_own_logit():
    indices, weights, expected = _routes(0.2, forced=[5, 1])
    assert indices.tolist() == [[[5, 1]] * 9] * 2
    want = torch.tensor([[w for _, w in row] for row in expected], dtype=torch.float64)
    assert float((weights - want).abs().max()) <= 1e-13


def test_every_residual_identity_holds_with_the_sparsemixer():
    from hookedattn.testing import assert_residual_identities

    model = moe_model(router_scoring="sparsemixer", sparsemixer_jitter_eps=0.2)
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    check = assert_residual_identities(model, cache)
    assert "sparsemixer(" in " ".join(check.checked) and not check.skipped


def test_an_epsilon_for_another_router_is_refused():
    with pytest.raises(ValueError, match="sparsemixer_jitter_eps=0.2 is the sparsemixer's"):
        HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=4, d_head=4, d_vocab=5, d_mlp=8,
                                gated_mlp=True, num_experts=4, experts_per_token=2,
                                sparsemixer_jitter_eps=0.2)  # fmt: skip
