"""The one gradient helper of the first-order methods (`analysis.patching.engine`):
`metric_gradients` against autograd run by hand on the model's own forward."""

import torch

from analysis.patching.engine import metric_gradients
from hookedattn.testing import random_tiny_model

TOKENS = torch.randint(0, 20, (3, 6), generator=torch.Generator().manual_seed(0))


def metric(logits):
    return logits[:, -1, 3] - logits[:, -1, 5]


def model():
    return random_tiny_model(0, n_ctx=6, d_vocab=20, act_fn="gelu", d_mlp=16)


def by_hand(m, layer):
    """d metric.sum() / d resid_pre of `layer`, by running the model on from a leaf there."""
    with torch.no_grad():
        _, cache = m.run_with_cache(TOKENS, names_filter=f"blocks.{layer}.hook_resid_pre")
    resid = cache[f"blocks.{layer}.hook_resid_pre"].clone().requires_grad_()
    (grad,) = torch.autograd.grad(metric(m(resid, start_at_layer=layer)).sum(), resid)
    return grad


def test_the_gradient_at_a_hook_point_is_the_metrics_gradient_at_that_activation():
    m = model()
    run = metric_gradients(m, ["blocks.1.hook_resid_pre"], lambda: metric(m(TOKENS)))
    torch.testing.assert_close(run.gradients["blocks.1.hook_resid_pre"], by_hand(m, 1))


def test_an_earlier_hook_points_gradient_keeps_the_paths_through_a_later_one():
    m = model()
    names = ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_pre"]
    run = metric_gradients(m, names, lambda: metric(m(TOKENS)))
    torch.testing.assert_close(run.gradients["blocks.0.hook_resid_pre"], by_hand(m, 0))


def test_the_value_and_activations_are_those_of_the_unhooked_forward():
    m = model()
    run = metric_gradients(m, ["blocks.1.hook_resid_pre"], lambda: metric(m(TOKENS)))
    with torch.no_grad():
        logits, cache = m.run_with_cache(TOKENS, names_filter="blocks.1.hook_resid_pre")
    assert torch.equal(run.value, metric(logits))
    assert torch.equal(run.activations["blocks.1.hook_resid_pre"], cache["blocks.1.hook_resid_pre"])


def test_frozen_parameters_give_the_same_gradient():
    m = model()
    expected = by_hand(m, 1)
    for p in m.parameters():
        p.requires_grad_(False)
    run = metric_gradients(m, ["blocks.1.hook_resid_pre"], lambda: metric(m(TOKENS)))
    torch.testing.assert_close(run.gradients["blocks.1.hook_resid_pre"], expected)


def test_the_parameters_grad_is_left_untouched():
    m = model()
    metric_gradients(m, ["blocks.1.hook_resid_pre"], lambda: metric(m(TOKENS)))
    assert all(p.requires_grad and p.grad is None for p in m.parameters())
