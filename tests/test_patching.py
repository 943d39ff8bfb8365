"""Activation patching: the batched sweep against a one-forward-per-patch loop."""

import pytest
import torch

from analysis.patching import Component, activation_patch, available_kinds
from analysis.patching.components import component_grid
from analysis.patching.engine import bytes_per_sequence, plan_chunks
from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.tolerances import tolerance

BATCH, N_POS, D_VOCAB = 2, 5, 11
TOL = tolerance(torch.float64).as_kwargs()


def make_model(**overrides) -> HookedTransformer:
    settings = dict(n_layers=2, d_model=16, n_heads=2, n_ctx=8, d_vocab=D_VOCAB, d_mlp=32, seed=0)
    settings.update(overrides)
    return HookedTransformer(HookedTransformerConfig(dtype=torch.float64, **settings))


def make_tokens(seed: int) -> torch.Tensor:
    return torch.randint(0, D_VOCAB, (BATCH, N_POS), generator=torch.Generator().manual_seed(seed))


CLEAN, CORRUPTED = make_tokens(1), make_tokens(2)
ANSWERS = torch.tensor([3, 7])


def logit_diff(logits: torch.Tensor) -> torch.Tensor:
    last = logits[:, -1]
    return last[torch.arange(len(ANSWERS)), ANSWERS] - last[:, 0]


# Where each component lies, written out here rather than taken from the library.
HEAD_AXIS = {"pattern": 1, "attn_scores": 1}
POS_AXIS = {"pattern": 2, "attn_scores": 2}


def region(component: Component) -> tuple:
    index = [slice(None)] * 4
    if component.pos is not None:
        index[POS_AXIS.get(component.name, 1)] = component.pos
    if component.head is not None:
        index[HEAD_AXIS.get(component.name, 2)] = component.head
    return tuple(index)


def loop_reference(model, target, source, components) -> torch.Tensor:
    """One forward pass per patched component, TransformerLens style."""
    _, source_cache = model.run_with_cache(source)
    rows = []
    for component in components:
        index = region(component)

        def patch(activation, hook, index=index):
            patched = activation.clone()
            index = index[: activation.ndim]
            patched[index] = source_cache[hook.name][index]
            return patched

        logits = model.run_with_hooks(target, fwd_hooks=[(component.hook_name, patch)])
        rows.append(logit_diff(logits))
    return torch.stack(rows)


KINDS = ["resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out", "z", "q", "k", "v"]


@pytest.mark.parametrize("kind", [*KINDS, "pattern", "attn_scores", "post"])
@pytest.mark.parametrize("by_pos", [True, False])
@pytest.mark.parametrize("direction", ["denoising", "noising"])
def test_batched_sweep_equals_one_forward_per_patch(kind, by_pos, direction):
    model = make_model()
    result = activation_patch(
        model,
        CLEAN,
        CORRUPTED,
        logit_diff,
        kind,
        by_pos=by_pos,
        direction=direction,
        memory_budget=40_000,
    )
    target, source = (CORRUPTED, CLEAN) if direction == "denoising" else (CLEAN, CORRUPTED)
    grid = component_grid(model, kind, N_POS, by_pos)
    expected = loop_reference(model, target, source, grid.components)
    torch.testing.assert_close(result.per_prompt.reshape(-1, BATCH), expected, **TOL)


@pytest.mark.parametrize("memory_budget", [1, 25_000, 10**9])
def test_every_chunking_gives_the_same_numbers(memory_budget):
    model = make_model()
    result = activation_patch(
        model, CLEAN, CORRUPTED, logit_diff, "z", by_pos=True, memory_budget=memory_budget
    )
    grid = component_grid(model, "z", N_POS, True)
    expected = loop_reference(model, CORRUPTED, CLEAN, grid.components)
    torch.testing.assert_close(result.per_prompt.reshape(-1, BATCH), expected, **TOL)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(positional_embedding_type="rotary", use_attn_result=True, use_split_qkv_input=True),
        dict(use_attn_in=True, use_hook_mlp_in=True, normalization_type="RMS"),
        dict(attn_only=True, d_mlp=None, normalization_type=None),
    ],
)
def test_every_kind_of_every_variant_matches_the_loop(overrides):
    model = make_model(**overrides)
    for kind in available_kinds(model):
        result = activation_patch(model, CLEAN, CORRUPTED, logit_diff, kind, by_pos=True)
        grid = component_grid(model, kind, N_POS, True)
        expected = loop_reference(model, CORRUPTED, CLEAN, grid.components)
        torch.testing.assert_close(result.per_prompt.reshape(-1, BATCH), expected, **TOL)


def test_chunks_fit_the_memory_budget_and_never_mix_layers():
    model = make_model()
    grid = component_grid(model, "z", N_POS, by_pos=True)
    budget = 30_000
    chunks = plan_chunks(model, grid.components, BATCH, N_POS, budget)
    assert sorted(i for chunk in chunks for i in chunk) == list(range(len(grid.components)))
    assert 2 < len(chunks) < len(grid.components)
    for chunk in chunks:
        chosen = [grid.components[i] for i in chunk]
        start, end = chosen[0].pos, max(c.pos for c in chosen) + 1
        assert {c.layer for c in chosen} == {chosen[0].layer}
        assert all(c.pos >= start for c in chosen)
        # A patch of a head's output in the last block changes nothing after its position.
        n_run = end - start if chosen[0].layer == 1 else N_POS - start
        if len(chunk) > 1:
            assert len(chunk) * BATCH * bytes_per_sequence(model, n_run, N_POS) <= budget


def test_patching_the_whole_residual_stream_gives_the_other_run():
    model = make_model()
    denoised = activation_patch(model, CLEAN, CORRUPTED, logit_diff, "resid_pre", by_pos=False)
    noised = activation_patch(
        model, CLEAN, CORRUPTED, logit_diff, "resid_pre", by_pos=False, direction="noising"
    )
    torch.testing.assert_close(denoised.normalised, torch.ones(2, dtype=torch.float64), **TOL)
    torch.testing.assert_close(noised.normalised, torch.zeros(2, dtype=torch.float64), **TOL)


def test_result_is_labelled_with_baselines():
    model = make_model()
    result = activation_patch(model, CLEAN, CORRUPTED, logit_diff, "z", by_pos=True)
    assert result.axes == ("layer", "pos", "head")
    assert result.shape == (2, N_POS, 2)
    assert result.labels[1] == tuple(str(p) for p in range(N_POS))
    torch.testing.assert_close(result.clean, logit_diff(model(CLEAN)), **TOL)
    torch.testing.assert_close(result.corrupted, logit_diff(model(CORRUPTED)), **TOL)
    gap = result.clean.mean() - result.corrupted.mean()
    expected = (result.per_prompt.mean(-1) - result.corrupted.mean()) / gap
    torch.testing.assert_close(result.normalised, expected, **TOL)
    assert result.label((1, 4, 0)) == "layer 1 pos 4 head 0"
    assert "z [layer=2, pos=5, head=2]" in repr(result)


def test_leaves_no_hooks_and_does_not_touch_its_inputs():
    model = make_model()
    clean, corrupted = CLEAN.clone(), CORRUPTED.clone()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    activation_patch(model, clean, corrupted, logit_diff, "pattern", by_pos=True)
    assert model.attached_hooks() == []
    assert torch.equal(clean, CLEAN) and torch.equal(corrupted, CORRUPTED)
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())


def test_hooks_are_detached_when_the_metric_fails_midway():
    model = make_model()
    calls = []

    def flaky(logits):
        calls.append(1)
        if len(calls) > 2:
            raise RuntimeError("metric broke")
        return logit_diff(logits)

    with pytest.raises(RuntimeError, match="metric broke"):
        activation_patch(model, CLEAN, CORRUPTED, flaky, "z")
    assert model.attached_hooks() == []


def test_clean_and_corrupted_of_different_shapes_is_an_error():
    model = make_model()
    with pytest.raises(ValueError, match=r"clean tokens have shape \(2, 5\).*\(2, 4\)"):
        activation_patch(model, CLEAN, CORRUPTED[:, :4], logit_diff)


def test_metric_without_one_value_per_prompt_is_an_error():
    model = make_model()
    with pytest.raises(ValueError, match=r"shape \(2,\); got shape \(\).*mean"):
        activation_patch(model, CLEAN, CORRUPTED, lambda logits: logit_diff(logits).mean())
    with pytest.raises(TypeError, match="got float"):
        activation_patch(model, CLEAN, CORRUPTED, lambda logits: 1.0)


def test_kind_the_model_lacks_is_an_error_naming_the_kinds_it_has():
    model = make_model(attn_only=True, d_mlp=None)
    with pytest.raises(ValueError, match=r"no 'mlp_out' \(it is attention-only\).*resid_pre"):
        activation_patch(model, CLEAN, CORRUPTED, logit_diff, "mlp_out")
    with pytest.raises(ValueError, match=r"unknown component kind 'atn_out'.*'attn_out'"):
        activation_patch(model, CLEAN, CORRUPTED, logit_diff, "atn_out")


def test_unknown_direction_is_an_error():
    model = make_model()
    with pytest.raises(ValueError, match="direction must be 'denoising' or 'noising'"):
        activation_patch(model, CLEAN, CORRUPTED, logit_diff, direction="backwards")
