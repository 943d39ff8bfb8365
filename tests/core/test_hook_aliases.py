"""Hook points that see the same tensor (a block's `hook_resid_post` and the next block's
`hook_resid_pre`; `hook_embed` and `blocks.0.hook_resid_pre` without learned positions):
a gradient edited at the later one reaches the earlier one, in backward order."""

from functools import partial

import pytest
import torch

from hookedattn.testing import tiny_model

TOKENS = torch.tensor([[1, 2, 3, 4, 5]])


make_model = partial(tiny_model, n_ctx=8, d_mlp=32)


def zero_grad(grad, hook):
    return torch.zeros_like(grad)


@pytest.mark.parametrize(
    ("earlier", "later", "overrides"),
    [
        ("blocks.0.hook_resid_post", "blocks.1.hook_resid_pre", {}),
        ("hook_embed", "blocks.0.hook_resid_pre", {"positional_embedding_type": "rotary"}),
        ("hook_embed", "blocks.0.hook_resid_pre", {"positional_embedding_type": "none"}),
    ],
)
def test_a_gradient_edited_at_the_later_of_two_aliased_points_reaches_the_earlier(
    earlier, later, overrides
):
    model = make_model(**overrides)
    seen = []
    hooks = [(later, zero_grad), (earlier, lambda grad, hook: seen.append(grad.clone()))]
    with model.hooks(bwd_hooks=hooks):
        _, cache = model.run_with_cache(TOKENS, return_type="loss", incl_bwd=True)
    assert torch.count_nonzero(cache[later + "_grad"]) == 0
    assert torch.count_nonzero(cache[earlier + "_grad"]) == 0
    assert len(seen) == 1 and torch.count_nonzero(seen[0]) == 0


def test_the_later_point_sees_the_gradient_before_the_earlier_one():
    model = make_model()
    order = []
    hooks = [
        ("blocks.0.hook_resid_post", lambda grad, hook: order.append(hook.name)),
        ("blocks.1.hook_resid_pre", lambda grad, hook: order.append(hook.name)),
    ]
    model.run_with_hooks(TOKENS, return_type="loss", bwd_hooks=hooks).backward()
    assert order == ["blocks.1.hook_resid_pre", "blocks.0.hook_resid_post"]


def test_unedited_aliased_gradients_are_equal():
    model = make_model()
    _, cache = model.run_with_cache(TOKENS, return_type="loss", incl_bwd=True)
    torch.testing.assert_close(
        cache["blocks.0.hook_resid_post_grad"], cache["blocks.1.hook_resid_pre_grad"]
    )
