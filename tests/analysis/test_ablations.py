"""Zero, mean and resample ablation of any component, and the pattern-preserving one."""

from functools import partial

import pytest
import torch

from analysis import Component, ablate, ablation_hooks, pattern_preserving_ablation
from hookedattn.core.tolerances import tolerance
from hookedattn.testing import tiny_model

TOL = tolerance(torch.float64).as_kwargs()
GEN = torch.Generator().manual_seed(0)
TOKENS = torch.randint(0, 11, (3, 5), generator=GEN)
REFERENCE = torch.randint(0, 11, (4, 5), generator=GEN)


make_model = partial(tiny_model, n_heads=2, n_ctx=8, d_vocab=11, d_mlp=32)


def replaced(model, tokens, name, index, value):
    """The logits with `activation[index] = value`, by a hand-written hook."""

    def hook(activation, hook):
        activation = activation.clone()
        activation[index] = value
        return activation

    return model.run_with_hooks(tokens, fwd_hooks=[(name, hook)])


def test_zero_ablation_of_a_head():
    model = make_model()
    logits = ablate(model, TOKENS, Component("z", 1, head=0))
    expected = replaced(model, TOKENS, "blocks.1.attn.hook_z", (slice(None), slice(None), 0), 0.0)
    torch.testing.assert_close(logits, expected, **TOL)


def test_zero_ablation_of_the_residual_stream_at_one_position():
    model = make_model()
    logits = ablate(model, TOKENS, Component("resid_mid", 0, pos=2))
    expected = replaced(model, TOKENS, "blocks.0.hook_resid_mid", (slice(None), 2), 0.0)
    torch.testing.assert_close(logits, expected, **TOL)


def test_zero_ablation_of_scores_keeps_the_causal_mask():
    model = make_model()
    hooks = ablation_hooks(model, Component("attn_scores", 0, head=1))
    with model.hooks(fwd_hooks=hooks):
        _, cache = model.run_with_cache(TOKENS, names_filter=["blocks.0.attn.hook_pattern"])
    pattern = cache["pattern", 0][:, 1]
    future = torch.ones(5, 5, dtype=torch.bool).triu(1)
    assert torch.all(pattern[:, future] == 0)
    uniform = 1 / torch.arange(1, 6, dtype=torch.float64)
    torch.testing.assert_close(pattern[:, :, 0], uniform.expand(3, 5), **TOL)


def test_mean_ablation_uses_the_reference_mean_at_each_position():
    model = make_model()
    _, reference = model.run_with_cache(REFERENCE)
    mean = reference["mlp_out", 0].mean(dim=0)
    logits = ablate(model, TOKENS, Component("mlp_out", 0), "mean", reference=REFERENCE)
    expected = replaced(model, TOKENS, "blocks.0.hook_mlp_out", (slice(None),), mean)
    torch.testing.assert_close(logits, expected, **TOL)


def test_resample_ablation_gives_each_prompt_a_reference_prompts_value():
    model = make_model()
    _, reference = model.run_with_cache(REFERENCE)
    component = Component("v", 0, head=1)
    seen = []
    for seed in (0, 1, 0):
        hooks = ablation_hooks(model, component, "resample", reference=reference, seed=seed)
        with model.hooks(fwd_hooks=hooks):
            _, cache = model.run_with_cache(TOKENS, names_filter=["blocks.0.attn.hook_v"])
        values = cache["v", 0][:, :, 1]
        candidates = reference["v", 0][:, :, 1]
        draws = [
            next(r for r in range(len(candidates)) if torch.equal(row, candidates[r]))
            for row in values
        ]
        seen.append(draws)
        untouched = model.run_with_cache(TOKENS)[1]["v", 0][:, :, 0]
        torch.testing.assert_close(cache["v", 0][:, :, 0], untouched, **TOL)
    assert seen[0] == seen[2]  # seeded
    assert seen[0] != seen[1]


def test_pattern_preserving_zero_ablation_is_the_one_of_pattern_ablation():
    model = make_model(attn_only=True, d_mlp=None)
    heads = [Component("z", 0, head=1), Component("z", 1, head=0)]
    logits = ablate(model, TOKENS, heads, preserve_patterns=True)
    expected = pattern_preserving_ablation(model, TOKENS, ["L0H1", "L1H0"])
    torch.testing.assert_close(logits, expected, **TOL)
    plain = ablate(model, TOKENS, heads)
    assert not torch.allclose(logits, plain)


def test_leaves_no_hooks_and_does_not_touch_its_inputs():
    model = make_model()
    tokens, reference = TOKENS.clone(), REFERENCE.clone()
    ablate(
        model, tokens, Component("z", 0), "resample", reference=reference, preserve_patterns=True
    )
    assert model.attached_hooks() == []
    assert torch.equal(tokens, TOKENS) and torch.equal(reference, REFERENCE)


def test_bad_input():
    model = make_model(attn_only=True, d_mlp=None)
    with pytest.raises(ValueError, match="it is attention-only"):
        ablate(model, TOKENS, Component("mlp_out", 0))
    with pytest.raises(ValueError, match="method must be one of 'zero', 'mean', 'resample'"):
        ablate(model, TOKENS, Component("z", 0), "average")
    with pytest.raises(ValueError, match="mean ablation needs a reference batch"):
        ablate(model, TOKENS, Component("z", 0), "mean")
    with pytest.raises(ValueError, match="same length"):
        ablate(model, TOKENS[:, :4], Component("z", 0), "mean", reference=REFERENCE)
    with pytest.raises(ValueError, match="head must be in 0..1"):
        ablate(model, TOKENS, Component("z", 0, head=2))
