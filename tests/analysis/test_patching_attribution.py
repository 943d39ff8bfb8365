"""Attribution patching against exact activation patching."""

import re

import pytest
import torch

from analysis.patching import (
    activation_patch,
    attribution_patch,
    available_kinds,
    compare_patching,
)
from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core.tolerances import tolerance

TOL = tolerance(torch.float64).as_kwargs()
GEN = torch.Generator().manual_seed(0)
CLEAN, CORRUPTED = (torch.randint(0, 11, (3, 6), generator=GEN) for _ in range(2))
PROMPTS = dict(clean_tokens=CLEAN, corrupted_tokens=CORRUPTED)
ANSWERS = torch.tensor([1, 2, 3])


def make_model(**overrides) -> HookedTransformer:
    settings = dict(n_layers=2, d_model=16, n_heads=2, n_ctx=8, d_vocab=11, d_mlp=32, seed=0)
    settings.update(overrides)
    return HookedTransformer(HookedTransformerConfig(dtype=torch.float64, **settings))


def logit_diff(logits: torch.Tensor) -> torch.Tensor:
    last = logits[:, -1]
    return last[torch.arange(3), ANSWERS] - last[:, 0]


@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_exact_where_the_metric_is_linear_in_the_activation(direction):
    # No norms, no MLP: the last block's outputs reach the logits linearly.
    model = make_model(attn_only=True, d_mlp=None, normalization_type=None)
    approx = attribution_patch(model, **PROMPTS, metric=logit_diff, direction=direction)
    for kind in ("z", "attn_out", "resid_post"):
        exact = activation_patch(model, kind, **PROMPTS, metric=logit_diff, direction=direction)
        last = approx[kind].per_prompt[-1]
        torch.testing.assert_close(last, exact.per_prompt[-1], **TOL)


@pytest.mark.parametrize("by_pos", [True, False])
def test_close_to_activation_patching_on_a_near_linear_model(by_pos):
    # Small weights and no norms: softmax and GELU barely bend over the patch (ReLU, the
    # default, has a kink that a first-order estimate cannot follow).
    model = make_model(init_range=0.02, normalization_type=None, act_fn="gelu")
    approx = attribution_patch(model, **PROMPTS, metric=logit_diff, by_pos=by_pos)
    assert set(approx) == set(available_kinds(model))
    for kind in approx:
        exact = activation_patch(model, kind, **PROMPTS, metric=logit_diff, by_pos=by_pos)
        comparison = compare_patching(approx[kind], exact)
        assert float(comparison.error.abs().max()) < 1e-3, (kind, comparison)


def test_comparison_lists_the_worst_components_first():
    model = make_model()  # layer norms and default weights: far from linear
    approx = attribution_patch(model, "z", **PROMPTS, metric=logit_diff, by_pos=True)["z"]
    exact = activation_patch(model, "z", **PROMPTS, metric=logit_diff, by_pos=True)
    comparison = compare_patching(approx, exact)
    worst = comparison.worst(4)
    errors = [abs(a - e) for _, a, e in worst]
    assert errors == sorted(errors, reverse=True)
    assert errors[0] == pytest.approx(float(comparison.error.abs().max()))
    label, a, e = worst[0]
    # "L1H0 pos 4": layer, head and position read back.
    layer, head, pos = (int(x) for x in re.fullmatch(r"L(\d+)H(\d+) pos (\d+)", label).groups())
    index = (layer, pos, head)
    assert label == exact.label(index)
    assert a == pytest.approx(float(approx.normalised[index]))
    assert e == pytest.approx(float(exact.normalised[index]))
    assert "max |error|" in repr(comparison)


def test_comparing_different_sweeps_is_an_error():
    model = make_model()
    approx = attribution_patch(model, "z", **PROMPTS, metric=logit_diff)["z"]
    exact = activation_patch(model, "z", **PROMPTS, metric=logit_diff, by_pos=True)
    with pytest.raises(ValueError, match=r"cannot compare z \[layer head\].*\[layer pos head\]"):
        compare_patching(approx, exact)


def test_two_forward_passes_and_parameters_untouched():
    model = make_model()
    passes = []
    model.add_perma_hook("hook_embed", lambda x, hook: passes.append(1))
    attribution_patch(model, **PROMPTS, metric=logit_diff)
    assert len(passes) == 2
    assert all(p.grad is None for p in model.parameters())
    model.reset_hooks(including_permanent=True)


def test_frozen_weights_give_the_same_attributions():
    model = make_model()
    before = attribution_patch(model, ["z", "resid_pre"], **PROMPTS, metric=logit_diff)
    model.requires_grad_(False)
    after = attribution_patch(model, ["z", "resid_pre"], **PROMPTS, metric=logit_diff)
    for kind in ("z", "resid_pre"):
        torch.testing.assert_close(after[kind].per_prompt, before[kind].per_prompt, **TOL)


def test_leaves_no_hooks_and_does_not_touch_its_inputs():
    model = make_model()
    clean, corrupted = CLEAN.clone(), CORRUPTED.clone()
    attribution_patch(model, clean_tokens=clean, corrupted_tokens=corrupted, metric=logit_diff)
    assert model.attached_hooks() == []
    assert torch.equal(clean, CLEAN) and torch.equal(corrupted, CORRUPTED)


def test_bad_input():
    model = make_model(attn_only=True, d_mlp=None)
    with pytest.raises(ValueError, match="attention-only"):
        attribution_patch(model, "mlp_out", **PROMPTS, metric=logit_diff)
    with pytest.raises(ValueError, match="clean tokens have shape"):
        attribution_patch(
            model, clean_tokens=CLEAN, corrupted_tokens=CORRUPTED[:2], metric=logit_diff
        )
    with pytest.raises(ValueError, match="one value per prompt"):
        attribution_patch(model, **PROMPTS, metric=lambda logits: logits.sum())
    with pytest.raises(KeyError, match="no 'mlp_out' here; kinds: z"):
        attribution_patch(model, "z", **PROMPTS, metric=logit_diff)["mlp_out"]
