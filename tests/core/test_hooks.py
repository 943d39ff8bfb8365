"""The hook system: attaching, ordering, nesting, permanence, backward hooks, and failure."""

from functools import partial

import pytest
import torch

from hookedattn.testing import tiny_model

make_model = partial(tiny_model, n_heads=2, n_ctx=12, d_vocab=20, d_mlp=32, dtype=torch.float32)


TOKENS = torch.tensor([[1, 2, 3, 4, 5, 6], [6, 5, 4, 3, 2, 1]])


def attached(model):
    return [(h.hook_point.name, h.dir) for h in model.attached_hooks()]


def test_returning_none_keeps_the_activation():
    model = make_model()
    seen = []
    out = model.run_with_hooks(
        TOKENS, fwd_hooks=[("blocks.0.attn.hook_z", lambda z, hook: seen.append(z.shape))]
    )
    assert seen == [(2, 6, 2, 8)]
    assert torch.equal(out, model(TOKENS))


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "written_out"])
def test_a_query_edited_by_a_hook_changes_its_own_position_only(fused):
    # A query is read by its own position alone: a NaN written into it must reach that
    # position's logits, and none other, whichever way attention runs.
    model = make_model(use_fused_kernels=fused, attn_only=True, n_layers=1)

    def poison(q, hook):
        q[:, 3, 0, 1] = float("nan")
        return q

    out = model.run_with_hooks(TOKENS[:, :4], fwd_hooks=[("blocks.0.attn.hook_q", poison)])
    assert out[:, 3].isnan().all()
    assert out[:, :3].isfinite().all()


def test_returning_a_tensor_replaces_the_activation():
    model = make_model()

    def zero_head_1(z, hook):
        z[:, :, 1] = 0
        return z

    _, cache = model.run_with_cache(TOKENS)
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", zero_head_1)]):
        patched, patched_cache = model.run_with_cache(TOKENS)
    assert (patched_cache["z", 0][:, :, 1] == 0).all()
    assert torch.equal(patched_cache["z", 0][:, :, 0], cache["z", 0][:, :, 0])
    assert not torch.allclose(patched, model(TOKENS))


def test_hook_receives_its_hook_point():
    model = make_model()
    names, layers = [], []

    def record(x, hook):
        names.append(hook.name)
        layers.append(hook.layer())

    model.run_with_hooks(
        TOKENS, fwd_hooks=[("blocks.1.hook_resid_pre", record), ("hook_embed", record)]
    )
    assert names == ["hook_embed", "blocks.1.hook_resid_pre"]
    assert layers == [None, 1]


def test_filter_function_selects_hook_points():
    model = make_model()
    names = []
    model.run_with_hooks(
        TOKENS,
        fwd_hooks=[(lambda n: n.endswith("hook_pattern"), lambda x, hook: names.append(hook.name))],
    )
    assert names == ["blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"]


def test_short_global_names_resolve():
    model = make_model()
    names = []
    model.run_with_hooks(TOKENS, fwd_hooks=[("embed", lambda x, hook: names.append(hook.name))])
    assert names == ["hook_embed"]


def test_hooks_run_in_attachment_order_and_prepend_goes_first():
    model = make_model()
    order = []
    model.add_hook("hook_embed", lambda x, hook: order.append("a"))
    model.add_hook("hook_embed", lambda x, hook: order.append("b"))
    model.add_hook("hook_embed", lambda x, hook: order.append("first"), prepend=True)
    model(TOKENS)
    model.reset_hooks()
    assert order == ["first", "a", "b"]


def test_replacements_chain_through_later_hooks():
    model = make_model()
    seen = []
    model.add_hook("hook_embed", lambda x, hook: x * 0)
    model.add_hook("hook_embed", lambda x, hook: seen.append(float(x.detach().abs().sum())))
    model(TOKENS)
    model.reset_hooks()
    assert seen == [0.0]


def test_context_manager_removes_its_hooks_on_exit():
    model = make_model()
    with model.hooks(fwd_hooks=[("hook_embed", lambda x, hook: None)]):
        assert attached(model) == [("hook_embed", "fwd")]
    assert attached(model) == []


def test_nested_contexts_remove_only_their_own_hooks():
    model = make_model()
    with model.hooks(fwd_hooks=[("hook_embed", lambda x, hook: None)]):
        with model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: None)]):
            assert len(attached(model)) == 2
        assert attached(model) == [("hook_embed", "fwd")]
    assert attached(model) == []


def test_context_keeps_hooks_when_asked():
    model = make_model()
    with model.hooks(fwd_hooks=[("hook_embed", lambda x, hook: None)], reset_hooks_end=False):
        pass
    assert attached(model) == [("hook_embed", "fwd")]
    model.reset_hooks()
    assert attached(model) == []


def test_exception_inside_a_hook_leaves_no_hook_and_no_weight_changed():
    model = make_model()
    before = {n: p.clone() for n, p in model.state_dict().items()}

    def broken(x, hook):
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.attn.hook_pattern", broken)])
    with pytest.raises(RuntimeError, match="boom"), model.hooks(fwd_hooks=[("hook_embed", broken)]):
        model(TOKENS)
    with pytest.raises(RuntimeError, match="boom"), model.hooks(fwd_hooks=[("hook_embed", broken)]):
        model.run_with_cache(TOKENS)
    assert attached(model) == []
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_permanent_hooks_survive_reset_unless_included():
    model = make_model()
    model.add_hook("hook_embed", lambda x, hook: None, is_permanent=True)
    model.add_hook("hook_embed", lambda x, hook: None)
    model.reset_hooks()
    assert len(attached(model)) == 1
    with model.hooks(fwd_hooks=[("hook_embed", lambda x, hook: None)]):
        pass
    assert len(attached(model)) == 1
    model.reset_hooks(including_permanent=True)
    assert attached(model) == []


def test_add_hook_returns_removable_handles():
    model = make_model()
    handles = model.add_hook(lambda n: n.endswith("hook_resid_pre"), lambda x, hook: None)
    assert len(handles) == 2
    handles[0].remove()
    handles[0].remove()  # idempotent
    assert attached(model) == [("blocks.1.hook_resid_pre", "fwd")]
    model.reset_hooks()


def test_unknown_hook_name_names_the_closest_valid_ones():
    model = make_model()
    with pytest.raises(KeyError, match="blocks.0.attn.hook_pattern"):
        model.run_with_hooks(
            TOKENS, fwd_hooks=[("blocks.0.attn.hook_patern", lambda x, hook: None)]
        )
    assert attached(model) == []


def test_a_bad_name_late_in_the_list_attaches_nothing():
    model = make_model()
    good = ("hook_embed", lambda x, hook: None)
    bad = ("blocks.9.hook_resid_pre", lambda x, hook: None)
    with (
        pytest.raises(KeyError, match="blocks.9.hook_resid_pre"),
        model.hooks(fwd_hooks=[good, bad]),
    ):
        pass
    assert attached(model) == []


def test_hook_point_of_a_disabled_flag_is_unknown():
    model = make_model()
    with pytest.raises(KeyError, match="hook_result"):
        model.add_hook("blocks.0.attn.hook_result", lambda x, hook: None)


def test_hook_returning_a_wrong_shape_names_the_hook_and_both_shapes():
    model = make_model()

    def squash(x, hook):
        return x[:, :, 0]

    with pytest.raises(
        ValueError, match=r"squash at blocks\.0\.hook_resid_post.*\(2, 6\).*\(2, 6, 16\)"
    ):
        model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.0.hook_resid_post", squash)])
    assert attached(model) == []


def test_hook_returning_a_wrong_dtype_is_an_error():
    model = make_model()
    with pytest.raises(ValueError, match="torch.float64"):
        model.run_with_hooks(TOKENS, fwd_hooks=[("hook_embed", lambda x, hook: x.double())])


def test_hook_returning_a_non_tensor_is_an_error():
    model = make_model()
    with pytest.raises(TypeError, match="returned float"):
        model.run_with_hooks(TOKENS, fwd_hooks=[("hook_embed", lambda x, hook: 1.0)])


def test_a_single_pair_instead_of_a_list_is_an_error():
    model = make_model()
    with pytest.raises(TypeError, match="list of"):
        model.run_with_hooks(TOKENS, fwd_hooks=("hook_embed", lambda x, hook: None))


def test_backward_hook_receives_the_gradient_of_the_activation():
    model = make_model()
    grads = []
    model.add_hook("blocks.1.hook_resid_mid", lambda g, hook: grads.append(g), dir="bwd")
    loss = model(TOKENS, return_type="loss")
    model.reset_hooks()
    resid_mid = []
    with model.hooks(fwd_hooks=[("blocks.1.hook_resid_mid", lambda x, hook: resid_mid.append(x))]):
        reference_loss = model(TOKENS, return_type="loss")
    (expected,) = torch.autograd.grad(reference_loss, resid_mid[0])
    loss.backward()
    assert len(grads) == 1
    torch.testing.assert_close(grads[0], expected)


def test_backward_hook_may_replace_the_gradient():
    model = make_model()
    model.add_hook("blocks.0.hook_resid_post", lambda g, hook: torch.zeros_like(g), dir="bwd")
    model(TOKENS, return_type="loss").backward()
    model.reset_hooks()
    # Everything upstream of the zeroed gradient receives nothing.
    assert model.embed.W_E.grad.abs().sum() == 0
    assert model.unembed.W_U.grad.abs().sum() > 0


def test_run_with_hooks_backward_hooks_fire_after_the_call():
    model = make_model()
    calls = []
    out = model.run_with_hooks(
        TOKENS,
        return_type="loss",
        bwd_hooks=[("hook_embed", lambda g, hook: calls.append(hook.name))],
    )
    assert attached(model) == []
    out.backward()
    assert calls == ["hook_embed"]


def test_hook_context_dict_persists_between_calls():
    model = make_model()

    def count(x, hook):
        hook.ctx["calls"] = hook.ctx.get("calls", 0) + 1

    with model.hooks(fwd_hooks=[("hook_embed", count)]):
        model(TOKENS)
        model(TOKENS)
    assert model.hook_dict["hook_embed"].ctx["calls"] == 2
    model.reset_hooks()
    assert model.hook_dict["hook_embed"].ctx == {}


def test_hook_dict_and_mod_dict_index_by_name():
    model = make_model()
    assert model.hook_dict["blocks.1.attn.hook_q"] is model.blocks[1].attn.hook_q
    assert model.mod_dict["blocks.1.attn"] is model.blocks[1].attn
    assert all(hp.name == name for name, hp in model.hook_dict.items())
