"""A mixture of plain experts (`gated_mlp=False`: each expert `act(x @ W_in + b_in) @ W_out +
b_out`, no gate; Nemotron-H's, relu2) against a loop over tokens.

The reference (`plain_moe_by_token`) computes each token's MLP output from the weights
alone, one token and one chosen expert at a time: DeepSeek V3's sigmoid router over groups
written out with Python lists (no dispatch, no hook point, no rearrange shared with the
model), then each chosen expert and the shared expert. Every weight and bias is random (the
router's choice bias too), float64, so agreement is to 1e-12.
"""

import pytest
import torch

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core.components.mlp import MLP
from hookedattn.testing.models import randomize_parameters

CONFIG = dict(
    n_layers=3, d_model=16, n_heads=4, d_head=4, n_ctx=16, d_vocab=23, d_mlp=8,
    gated_mlp=False, act_fn="relu2", normalization_type="RMS",
    positional_embedding_type="rotary", num_experts=8, experts_per_token=2,
    router_scoring="sigmoid", n_expert_groups=4, topk_expert_groups=2, norm_topk_prob=True,
    routed_scaling_factor=2.5, d_mlp_shared=10, moe_layers=(True, False, True), d_mlp_dense=12,
    dtype="float64", seed=0,
)  # fmt: skip
TOKENS = torch.randint(0, 23, (2, 7), generator=torch.Generator().manual_seed(3))


def plain_model(**overrides) -> HookedTransformer:
    cfg = HookedTransformerConfig(**{**CONFIG, **overrides})
    return randomize_parameters(HookedTransformer(cfg), scale=0.5, seed=1)


def relu2(x: torch.Tensor) -> torch.Tensor:
    return torch.clamp(x, min=0) ** 2


def chosen_experts(moe, scores: torch.Tensor) -> list[int]:
    """The sigmoid router's choice for one token: the best `k` experts by score plus choice
    bias, among the experts of the groups whose two best experts sum highest."""
    choice = (scores + moe.b_router_choice).tolist()
    n, groups = len(choice), moe.n_expert_groups
    size = n // groups
    group_score = [sum(sorted(choice[g * size : (g + 1) * size])[-2:]) for g in range(groups)]
    kept = sorted(range(groups), key=lambda g: -group_score[g])[: moe.topk_expert_groups]
    allowed = [e for e in range(n) if e // size in kept]
    return sorted(allowed, key=lambda e: -choice[e])[: moe.experts_per_token]


def plain_moe_by_token(moe, x: torch.Tensor) -> torch.Tensor:
    """The mixture's output, token by token, from its weights."""
    out = torch.zeros_like(x)
    shared = moe.shared_expert
    for b in range(x.shape[0]):
        for p in range(x.shape[1]):
            v = x[b, p]
            scores = torch.sigmoid(v @ moe.W_router + moe.b_router)
            chosen = chosen_experts(moe, scores)
            weights = scores[chosen] / scores[chosen].sum() * moe.routed_scaling_factor
            for weight, e in zip(weights, chosen, strict=True):
                expert = relu2(v @ moe.W_in[e] + moe.b_in[e]) @ moe.W_out[e] + moe.b_out[e]
                out[b, p] += weight * expert
            out[b, p] += relu2(v @ shared.W_in + shared.b_in) @ shared.W_out + shared.b_out
    return out


@pytest.mark.parametrize("layer", [0, 2])
def test_plain_experts_equal_a_loop_over_tokens(layer):
    model = plain_model()
    names = [f"blocks.{layer}.ln2.hook_out", f"blocks.{layer}.hook_mlp_out"]
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS, names_filter=names)
        expected = plain_moe_by_token(model.blocks[layer].mlp, cache[names[0]])
    torch.testing.assert_close(cache[names[1]], expected, rtol=0, atol=1e-12)


def test_plain_experts_have_no_gate_and_the_dense_block_is_plain():
    model = plain_model()
    moe = model.blocks[0].mlp
    assert not hasattr(moe, "W_gate") and not hasattr(moe, "b_gate")
    assert not any(".hook_pre_linear" in name for name in model.hook_dict)
    assert type(moe.shared_expert) is MLP and moe.shared_expert.W_in.shape == (16, 10)
    assert type(model.blocks[1].mlp) is MLP and model.blocks[1].mlp.W_in.shape == (16, 12)


def test_every_residual_identity_holds_with_plain_experts():
    from hookedattn.testing import assert_residual_identities

    model = plain_model()
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    check = assert_residual_identities(model, cache)
    assert "blocks.0.mlp.experts.7.hook_post == act_fn(" in " ".join(check.checked)
    assert not check.skipped


def test_plain_experts_grouped_equal_one_by_one():
    model = plain_model().to(torch.float32)  # float32 without gradients: grouped products
    one_by_one = [("blocks.0.mlp.experts.3.hook_out", lambda rows, hook: None)]
    with torch.no_grad():
        grouped = model(TOKENS)
        hooked = model.run_with_hooks(TOKENS, fwd_hooks=one_by_one)
    torch.testing.assert_close(grouped, hooked, rtol=1e-5, atol=1e-5)


def test_a_clamped_swiglu_needs_gated_experts():
    with pytest.raises(ValueError, match="swiglu_limit=0.7 clamps a gated expert's SwiGLU"):
        HookedTransformerConfig(**{**CONFIG, "swiglu_limit": 0.7})
