"""A mixture of experts against a loop over tokens: the forward, the routing hook points, and
interventions that act (edited router logits re-route, forced experts, edited weights,
an ablated expert changes exactly the tokens routed to it).

The reference (`moe_by_token`, in tests/helpers/moe.py) computes each token's MLP output
from the weights alone, one token and one chosen expert at a time, with no dispatch, no
hook point and no einsum shared with the model; each test compares the model's
`hook_mlp_out` with it, given the MLP input the model recorded (`ln2.hook_out`). Every
weight, bias and gain is random (the router's bias too), float64, so agreement is to 1e-12.
"""

import pytest
import torch
from helpers.moe import TOKENS, VARIANTS, moe_by_token, moe_model, one_expert

from hookedattn import HookedTransformer


@pytest.fixture(params=list(VARIANTS))
def model(request) -> HookedTransformer:
    return moe_model(**VARIANTS[request.param])


def recorded(model, layer: int, hooks=()) -> tuple[torch.Tensor, torch.Tensor]:
    """The MLP input and output of block `layer` in a forward with `hooks`."""
    names = [f"blocks.{layer}.ln2.hook_out", f"blocks.{layer}.hook_mlp_out"]
    with torch.no_grad(), model.hooks(fwd_hooks=list(hooks)):
        _, cache = model.run_with_cache(TOKENS, names_filter=names)
    return cache[names[0]], cache[names[1]]


def assert_close(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


# ---------------------------------------------------------------- the forward
@pytest.mark.parametrize("layer", [0, 1])
def test_the_mixture_equals_a_loop_over_tokens(model, layer):
    x, mlp_out = recorded(model, layer)
    with torch.no_grad():
        assert_close(mlp_out, moe_by_token(model.blocks[layer].mlp, x))


def test_idle_hooks_and_a_full_cache_give_the_same_logits(model):
    with torch.no_grad():
        plain = model(TOKENS)
        cached, _ = model.run_with_cache(TOKENS)
    assert_close(plain, cached)


def test_each_experts_rows_are_its_tokens_in_order(model):
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    moe, x = model.blocks[0].mlp, cache["blocks.0.ln2.hook_out"]
    chosen = cache["blocks.0.mlp.hook_expert_indices"]
    for e in range(moe.num_experts):
        batch, pos, _ = (chosen == e).nonzero(as_tuple=True)
        rows = cache["expert_out", 0, e]
        assert rows.shape == (len(batch), model.cfg.d_model)
        assert_close(cache["expert_in", 0, e], x[batch, pos])
        with torch.no_grad():
            tokens = zip(batch, pos, strict=True)
            expected = torch.stack([one_expert(moe, e, x[b, p]) for b, p in tokens])
        assert_close(rows, expected)


def test_the_cache_holds_one_row_per_token_and_choice_not_a_dense_expert_axis(model):
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    cfg = model.cfg
    n_rows = sum(cache["expert_out", 0, e].shape[0] for e in range(cfg.num_experts))
    assert n_rows == TOKENS.numel() * cfg.experts_per_token
    dense = TOKENS.numel() * cfg.num_experts * cfg.d_model
    assert all(t.numel() < dense for t in cache.values())


def test_pos_slice_and_remove_batch_dim_keep_an_experts_rows_whole():
    model = moe_model()
    one = TOKENS[:1]
    with torch.no_grad():
        _, full = model.run_with_cache(one)
        _, sliced = model.run_with_cache(one, pos_slice=-1, remove_batch_dim=True)
    assert sliced["resid_post", 0].shape == (1, model.cfg.d_model)
    for e in range(model.cfg.num_experts):
        assert torch.equal(sliced["expert_out", 0, e], full["expert_out", 0, e])
    assert torch.equal(full.remove_batch_dim()["expert_pre", 1, 2], full["expert_pre", 1, 2])


# ---------------------------------------------------------------- interventions
def test_edited_router_logits_reroute(model):
    # Token (1, 3) is pushed onto expert 5 and (0, 0) away from its first choice.
    first = recorded(model, 0, [])[0]
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS, names_filter="blocks.0.mlp.hook_expert_indices")
    avoided = int(cache["blocks.0.mlp.hook_expert_indices"][0, 0, 0])

    def edit(b, p, logits):
        logits = logits.clone()
        if (b, p) == (1, 3):
            logits[5] += 20.0
        if (b, p) == (0, 0):
            logits[avoided] -= 20.0
        return logits

    def hook(logits, hook):
        logits = logits.clone()
        logits[1, 3, 5] += 20.0
        logits[0, 0, avoided] -= 20.0
        return logits

    hooks = [("blocks.0.mlp.hook_router_logits", hook)]
    x, mlp_out = recorded(model, 0, hooks)
    assert_close(x, first)
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        _, cache = model.run_with_cache(TOKENS, names_filter="blocks.0.mlp.hook_expert_indices")
    chosen = cache["blocks.0.mlp.hook_expert_indices"]
    assert 5 in chosen[1, 3].tolist() and avoided not in chosen[0, 0].tolist()
    with torch.no_grad():
        assert_close(mlp_out, moe_by_token(model.blocks[0].mlp, x, logits_fn=edit))


def test_forced_experts_are_used_with_their_own_weights(model):
    forced = torch.tensor([4, 1])  # for every token: experts 4 and 1

    def hook(indices, hook):
        return forced.expand_as(indices).clone()

    x, mlp_out = recorded(model, 1, [("blocks.1.mlp.hook_expert_indices", hook)])
    with torch.no_grad():
        expected = moe_by_token(model.blocks[1].mlp, x, choose=lambda b, p, c: forced)
    assert_close(mlp_out, expected)


def test_edited_weights_mix_as_given(model):
    def hook(weights, hook):
        return weights * torch.tensor([2.0, -1.0], dtype=weights.dtype)

    x, mlp_out = recorded(model, 0, [("blocks.0.mlp.hook_expert_weights", hook)])
    edit = lambda b, p, w: w * torch.tensor([2.0, -1.0], dtype=w.dtype)
    with torch.no_grad():
        assert_close(mlp_out, moe_by_token(model.blocks[0].mlp, x, weigh=edit))


def test_ablating_an_expert_changes_exactly_the_tokens_routed_to_it(model):
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS, names_filter="blocks.0.mlp.hook_expert_indices")
    chosen = cache["blocks.0.mlp.hook_expert_indices"]
    expert = int(chosen[0, 2, 1])  # an expert some token uses
    hooks = [(f"blocks.0.mlp.experts.{expert}.hook_out", lambda rows, hook: rows * 0)]
    x, before = recorded(model, 0)
    _, after = recorded(model, 0, hooks)
    routed = (chosen == expert).any(dim=-1)
    changed = (after - before).abs().amax(dim=-1) > 0
    assert torch.equal(changed, routed) and 0 < int(routed.sum()) < routed.numel()
    with torch.no_grad():
        assert_close(after, moe_by_token(model.blocks[0].mlp, x, drop=expert))


def test_an_expert_no_token_chose_runs_on_zero_rows_only_when_hooked():
    model = moe_model()
    first_two = lambda indices, hook: torch.zeros_like(indices) + torch.tensor([0, 1])
    force = [("blocks.0.mlp.hook_expert_indices", first_two)]
    seen = []
    with torch.no_grad(), model.hooks(fwd_hooks=force):
        model(TOKENS)  # experts 2..5 idle: not run
        hooked = [("blocks.0.mlp.experts.4.hook_pre", lambda t, hook: seen.append(t.shape))]
        with model.hooks(fwd_hooks=hooked):
            model(TOKENS)
    assert seen == [torch.Size([0, model.cfg.d_mlp])]


def test_a_hook_choosing_an_expert_that_does_not_exist_is_refused():
    model = moe_model()
    hook = lambda indices, hook: indices + 100
    with pytest.raises(ValueError, match=r"expert ids \[100.*outside 0\.\.5"):
        model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.1.mlp.hook_expert_indices", hook)])


def test_gradients_reach_the_router_and_exactly_the_experts_used():
    model = moe_model(norm_topk_prob=True)
    force = lambda indices, hook: torch.zeros_like(indices) + torch.tensor([3, 0])
    loss = model.run_with_hooks(
        TOKENS, return_type="loss", fwd_hooks=[("blocks.0.mlp.hook_expert_indices", force)]
    )
    loss.backward()
    moe = model.blocks[0].mlp
    assert float(moe.W_router.grad.abs().sum()) > 0  # through the weights of experts 3 and 0
    reached = [float(moe.W_in.grad[e].abs().sum()) > 0 for e in range(moe.num_experts)]
    assert reached == [True, False, False, True, False, False]


def test_short_names_reach_the_routing_and_expert_points():
    model = moe_model(d_mlp_shared=10, shared_expert_gate=True)
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    assert cache["router_logits", 1].shape == (2, 7, 6)
    assert cache["expert_indices", 0].dtype == torch.int64
    assert cache["expert_weights", -1].shape == (2, 7, 2)
    assert cache["shared_out", 0].shape == (2, 7, 16)
    assert cache["shared_post", 0].shape == (2, 7, 10)
    assert "blocks.1.mlp.experts.5.hook_pre_linear" in cache


def test_every_named_axis_of_a_mixtures_points_has_its_size():
    # axis_names is what the store, SAE splicing and the identities read a point's layout from.
    # The points of the MLP: the router, the chosen experts, each expert's rows, the shared one.
    from hookedattn.core import names

    model = moe_model(d_mlp_shared=10, shared_expert_gate=True)
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    sizes = {"batch": 2, "pos": 7, "row": None, "k": 2, "expert": 6}
    named = 0
    for name, activation in cache.items():
        axes = names.axis_names(name)
        if ".mlp." not in name or not axes:
            continue
        expected = [sizes[a] if a in sizes else getattr(model.cfg, a) for a in axes]
        got = [None if e is None else n for e, n in zip(expected, activation.shape, strict=True)]
        assert got == expected, (name, axes)
        named += 1
    assert names.axis_names("blocks.0.mlp.shared_expert.hook_post")[-1] == "d_mlp_shared"
    assert named == 2 * (3 + 6 * 5 + 4)  # per block: routing, 6 experts' rows, shared


def test_an_sae_of_the_shared_experts_width_splices_at_its_neurons():
    from hookedattn.sae import SAEConfig, SparseAutoencoder, spliced

    model = moe_model(d_mlp_shared=10, shared_expert_gate=True)
    point = "blocks.0.mlp.shared_expert.hook_post"
    fits = SparseAutoencoder(SAEConfig(10, 20, hook_name=point)).to(torch.float64)
    with torch.no_grad(), spliced(model, [fits]):
        model(TOKENS)
    too_narrow = SparseAutoencoder(SAEConfig(8, 20, hook_name=point)).to(torch.float64)
    with pytest.raises(ValueError, match="d_mlp_shared=10"), spliced(model, [too_narrow]):
        pass


@pytest.mark.parametrize("variant", [*VARIANTS, "sinks"])
def test_every_residual_identity_holds_in_a_mixture_of_experts(variant):
    from hookedattn.testing import assert_residual_identities

    model = moe_model(**VARIANTS.get(variant, dict(use_attn_sinks=True)))
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    check = assert_residual_identities(model, cache)
    statements = " ".join(check.checked)
    assert "at the tokens routed to expert 5" in statements
    assert "sum of each token's weighted expert outputs" in statements
    assert ("sinks" in statements) == (variant == "sinks")
    assert not check.skipped


def test_a_broken_mixture_fails_the_identities():
    from hookedattn.testing import assert_residual_identities

    model = moe_model()
    hooks = [("blocks.1.mlp.experts.2.hook_out", lambda rows, hook: rows * 1.5)]
    with torch.no_grad(), model.hooks(fwd_hooks=hooks):
        _, cache = model.run_with_cache(TOKENS)
    with pytest.raises(
        AssertionError, match="experts.2.hook_out == blocks.1.mlp.experts.2.hook_post"
    ):
        assert_residual_identities(model, cache)


def test_a_saved_mixture_loads_back_with_its_routing(tmp_path):
    model = moe_model(d_mlp_shared=10, shared_expert_gate=True, use_attn_sinks=True,
                      swiglu_limit=0.7)  # fmt: skip
    model.save(tmp_path)
    loaded = HookedTransformer.load(tmp_path)
    assert loaded.cfg == model.cfg
    with torch.no_grad():
        assert torch.equal(loaded(TOKENS), model(TOKENS))


@pytest.mark.parametrize("shape", [dict(swiglu_limit=0.7), dict(d_mlp_shared=10)])
def test_grouped_products_equal_the_experts_one_by_one(shape):
    from hookedattn.core.kernels._experts import _groups

    model = moe_model(**shape).to(torch.float32)  # random biases: each row takes its own
    moe, rows = model.blocks[0].mlp, torch.zeros(3, model.cfg.d_model)
    one_by_one = [("blocks.1.mlp.experts.0.hook_in", lambda x, hook: None),
                  ("blocks.0.mlp.experts.3.hook_out", lambda x, hook: None)]  # fmt: skip
    with torch.no_grad():
        assert _groups(moe, rows) and not _groups(moe, rows.double())
        grouped = model(TOKENS)
        hooked = model.run_with_hooks(TOKENS, fwd_hooks=one_by_one)
        with model.hooks(fwd_hooks=one_by_one):
            assert not _groups(moe, rows)
    assert not _groups(moe, rows)  # gradients recorded: one expert at a time
    torch.testing.assert_close(grouped, hooked, rtol=1e-5, atol=1e-5)
