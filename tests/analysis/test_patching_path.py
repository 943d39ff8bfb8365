"""Path patching on a hand-built linear model whose every path is known."""

import pytest
import torch
from helpers.linear_paths import CLEAN, CORRUPTED, hand_built, metric, paths

from analysis.patching import Component, activation_patch, path_patch
from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core.tolerances import tolerance

TOL = tolerance(torch.float64).as_kwargs()
PROMPTS = dict(clean_tokens=CLEAN, corrupted_tokens=CORRUPTED)
S = Component("z", 0, head=0)


def run(receivers, senders=(S,), **kwargs):
    model = hand_built()
    return path_patch(model, receivers, list(senders), **PROMPTS, metric=metric, **kwargs)


def test_baselines_are_the_two_paths_summed():
    result = run(Component("v", 2, head=0))
    torch.testing.assert_close(result.clean, sum(paths(CLEAN)), **TOL)
    torch.testing.assert_close(result.corrupted, sum(paths(CORRUPTED)), **TOL)


def test_path_to_the_receivers_values_carries_only_its_own_route():
    (_, e_clean), (d_corrupted, _) = paths(CLEAN), paths(CORRUPTED)
    result = run(Component("v", 2, head=0))
    torch.testing.assert_close(result.per_prompt[0], d_corrupted + e_clean, **TOL)


def test_path_through_an_intermediate_head_is_cut_by_freezing():
    # R2 hears S only through M, which step 1 freezes: no effect at all.
    result = run(Component("v", 2, head=1))
    torch.testing.assert_close(result.per_prompt[0], result.clean, **TOL)


def test_path_to_the_intermediate_head_carries_the_route_through_it():
    (d_clean, _), (_, e_corrupted) = paths(CLEAN), paths(CORRUPTED)
    result = run(Component("v", 1, head=0))
    torch.testing.assert_close(result.per_prompt[0], d_clean + e_corrupted, **TOL)


def test_paths_that_do_not_exist_have_no_effect():
    for receiver in (Component("k", 2, head=0), Component("resid_post", 2)):
        result = run(receiver)
        torch.testing.assert_close(result.per_prompt[0], result.clean, **TOL)


def test_the_two_routes_add_up_to_patching_the_sender():
    model = hand_built()
    whole = activation_patch(model, "z", **PROMPTS, metric=metric, direction="noising")
    via_r = run(Component("v", 2, head=0)).per_prompt[0]
    via_m = run(Component("v", 1, head=0)).per_prompt[0]
    clean = whole.clean
    torch.testing.assert_close(via_r - clean + via_m - clean, whole.per_prompt[0, 0] - clean, **TOL)


def test_denoising_is_the_mirror_image():
    (d_clean, _), (_, e_corrupted) = paths(CLEAN), paths(CORRUPTED)
    result = run(Component("v", 2, head=0), direction="denoising")
    torch.testing.assert_close(result.per_prompt[0], d_clean + e_corrupted, **TOL)


def test_every_head_as_sender_in_one_call_matches_each_alone():
    model = hand_built()
    receivers = [Component("v", 2, head=0), Component("v", 1, head=0)]
    sweep = path_patch(model, receivers, "z", **PROMPTS, metric=metric, memory_budget=1)
    assert sweep.axes == ("layer", "head") and sweep.shape == (3, 2)
    for layer in range(3):
        for head in range(2):
            alone = run(receivers, [Component("z", layer, head=head)])
            torch.testing.assert_close(sweep.per_prompt[layer, head], alone.per_prompt[0], **TOL)


def test_frozen_mlps_leave_only_the_direct_path_to_the_logits():
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=16, n_heads=2, n_ctx=8, d_vocab=11, d_mlp=32, seed=0,
        dtype=torch.float64,
    )  # fmt: skip
    model = HookedTransformer(cfg)
    g = torch.Generator().manual_seed(0)
    clean, corrupted = (torch.randint(0, 11, (2, 5), generator=g) for _ in range(2))
    sender, last = Component("z", 0, head=1), Component("resid_post", 1)
    result = path_patch(
        model,
        last,
        [sender],
        clean_tokens=clean,
        corrupted_tokens=corrupted,
        metric=metric,
        freeze_mlps=True,
    )
    _, clean_cache = model.run_with_cache(clean)
    _, corrupted_cache = model.run_with_cache(corrupted)
    z = "blocks.0.attn.hook_z"
    delta = (corrupted_cache[z] - clean_cache[z])[:, :, 1] @ model.W_O[0, 1]
    logits = model.run_with_hooks(
        clean, fwd_hooks=[("blocks.1.hook_resid_post", lambda x, hook: x + delta)]
    )
    torch.testing.assert_close(result.per_prompt[0], metric(logits), **TOL)


def test_leaves_no_hooks_and_checks_its_components():
    model = hand_built()
    path_patch(model, Component("v", 2, head=0), **PROMPTS, metric=metric)
    assert model.attached_hooks() == []
    with pytest.raises(ValueError, match="head must be in 0..1"):
        path_patch(model, Component("v", 2, head=5), **PROMPTS, metric=metric)
    with pytest.raises(ValueError, match="it is attention-only"):
        path_patch(model, Component("mlp_out", 1), **PROMPTS, metric=metric)
    with pytest.raises(ValueError, match="clean tokens have shape"):
        path_patch(
            model,
            Component("v", 2, head=0),
            clean_tokens=CLEAN,
            corrupted_tokens=CORRUPTED[:1],
            metric=metric,
        )
