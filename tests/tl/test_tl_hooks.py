"""Hook points with TransformerLens's idioms: has_hooks, list_hooks, backward hooks `(grad,)`."""

import torch
from torch.testing import assert_close

from hookedattn.testing import tiny_model
from hookedattn_tl import HookedTransformer
from hookedattn_tl.hook_points import HookPoint

TOKENS = torch.tensor([[1, 2, 3, 4]])


def make_model() -> HookedTransformer:
    fields = dict(n_layers=1, d_model=8, n_heads=2, d_mlp=16, n_ctx=8, d_vocab=10, act_fn="gelu")
    return tiny_model(model_class=HookedTransformer, dtype=torch.float32, **fields)


def test_has_hooks_by_direction_and_permanence():
    model = make_model()
    point = model.hook_dict["blocks.0.hook_resid_pre"]
    assert isinstance(point, HookPoint)
    assert not point.has_hooks()
    model.add_perma_hook("blocks.0.hook_resid_pre", lambda x, hook: None)
    assert point.has_hooks() and point.has_hooks("fwd") and not point.has_hooks("bwd")
    assert not point.has_hooks(including_permanent=False)
    model.add_hook("blocks.0.hook_resid_pre", lambda g, hook: None, dir="bwd")
    assert point.has_hooks("bwd", including_permanent=False)
    model.reset_hooks(including_permanent=True)
    assert not point.has_hooks()


def test_list_hooks_groups_by_name_and_filters():
    model = make_model()
    fn = lambda x, hook: None
    model.add_hook("blocks.0.hook_resid_pre", fn)
    model.add_hook(lambda name: name.endswith("hook_pattern"), fn, dir="bwd")
    listed = model.list_hooks()
    assert sorted(listed) == ["blocks.0.attn.hook_pattern", "blocks.0.hook_resid_pre"]
    assert [h.fn for h in listed["blocks.0.hook_resid_pre"]] == [fn]
    assert list(model.list_hooks(dir="bwd")) == ["blocks.0.attn.hook_pattern"]
    assert list(model.list_hooks("blocks.0.hook_resid_pre")) == ["blocks.0.hook_resid_pre"]
    assert model.list_hooks(["hook_embed"]) == {}


def test_backward_hook_returning_a_one_tuple_replaces_the_gradient():
    model = make_model()
    seen = {}

    def double(grad, hook):
        return (2 * grad,)  # TransformerLens's backward-hook convention

    def record(grad, hook):
        seen["grad"] = grad.clone()

    model.add_hook("blocks.0.hook_resid_pre", record, dir="bwd")
    model(TOKENS, return_type="loss").backward()
    plain, plain_W_E = seen["grad"], model.embed.W_E.grad.clone()
    model.zero_grad()
    model.add_hook("blocks.0.hook_resid_mid", double, dir="bwd")
    model(TOKENS, return_type="loss").backward()
    # Every path from resid_pre to the loss passes resid_mid, so its gradient doubles too.
    assert_close(seen["grad"], 2 * plain)
    model.reset_hooks()
    model.zero_grad()
    model.run_with_hooks(TOKENS, return_type="loss", bwd_hooks=[("hook_embed", double)]).backward()
    assert_close(model.embed.W_E.grad, 2 * plain_W_E)


def test_a_prepended_hook_is_listed_and_run_first():
    point, order = HookPoint(), []
    point.add_hook(lambda x, hook: order.append("appended"), dir="fwd")
    point.add_hook(lambda x, hook: order.append("prepended"), dir="fwd", prepend=True)
    point(torch.zeros(2))
    assert order == ["prepended", "appended"]
    assert point.fwd_hooks[0].user_hook(None, None) is None and order[-1] == "prepended"
