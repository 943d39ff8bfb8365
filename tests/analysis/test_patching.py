"""Activation patching: the batched engine against the one-forward-per-patch reference.

Every kind of every model variant, both directions, by position or not, and memory budgets
from one variant per pass to everything in one: the engine must give the numbers of
`_reference.reference_sweep` (float64, to ~1e-10).
"""

import functools
import warnings

import pytest
import torch

from analysis.patching import Component, activation_patch, available_kinds
from analysis.patching._components import component_grid
from analysis.patching._edits import Edit, extents
from analysis.patching._inputs import base_run
from analysis.patching._reference import reference_sweep, region
from analysis.patching._sweep import sweep
from hookedattn import HookedTransformer
from hookedattn.testing import random_tokens, tiny_model

BATCH, N_POS, D_VOCAB = 2, 5, 11
EXACT = dict(rtol=0.0, atol=1e-10)

VARIANTS = {
    "2 layers, LN, MLP": dict(),
    "3 layers, RMS, per-head inputs": dict(
        n_layers=3, normalization_type="RMS", use_attn_in=True, use_hook_mlp_in=True
    ),
    "attention-only, no norm, split qkv": dict(
        attn_only=True, d_mlp=None, normalization_type=None, use_split_qkv_input=True
    ),
    "rotary, split qkv, attn result": dict(
        positional_embedding_type="rotary", use_attn_result=True, use_split_qkv_input=True
    ),
    # No room in the context after the earlier keys: every variant at its own place.
    "context full": dict(n_ctx=N_POS, use_attn_result=True),
    "sliding window, grouped keys": dict(
        window_size=2, attn_types=("local", "global"), n_key_value_heads=1
    ),
    "parallel blocks, gated MLP": dict(parallel_attn_mlp=True, gated_mlp=True),
}  # fmt: skip


@functools.cache
def make_model(name: str) -> HookedTransformer:
    """`hookedattn.testing.tiny_model` with two heads, D_VOCAB tokens and `VARIANTS[name]`."""
    return tiny_model(**{"n_heads": 2, "d_vocab": D_VOCAB, "d_mlp": 32, **VARIANTS[name]})


CLEAN, CORRUPTED = (random_tokens(D_VOCAB, BATCH, N_POS, seed) for seed in (1, 2))
PROMPTS = dict(clean_tokens=CLEAN, corrupted_tokens=CORRUPTED)
ANSWERS = torch.tensor([3, 7])


def logit_diff(logits: torch.Tensor) -> torch.Tensor:
    """Reads every position, so that no patch is skipped."""
    return (logits[:, :, 3] - logits[:, :, 0]).sum(1) + logits[torch.arange(BATCH), -1, ANSWERS]


def reference(model, kind, by_pos, direction):
    target, source = (CORRUPTED, CLEAN) if direction == "denoising" else (CLEAN, CORRUPTED)
    _, cache = model.run_with_cache(source)
    components = component_grid(model, kind, N_POS, by_pos).components
    return reference_sweep(model, target, cache, components, logit_diff)


# Every variant, each direction on several of them (a reference sweep is hundreds of runs).
CASES = [
    ("2 layers, LN, MLP", "denoising"),
    ("2 layers, LN, MLP", "noising"),
    ("3 layers, RMS, per-head inputs", "noising"),
    ("attention-only, no norm, split qkv", "denoising"),
    ("rotary, split qkv, attn result", "noising"),
    ("context full", "denoising"),
    ("sliding window, grouped keys", "noising"),
    ("parallel blocks, gated MLP", "denoising"),
]


@pytest.mark.parametrize(("name", "direction"), CASES)
def test_every_kind_matches_the_reference(name, direction):
    model = make_model(name)
    for kind in available_kinds(model):
        for by_pos in (True, False):
            result = activation_patch(
                model, kind, **PROMPTS, metric=logit_diff, by_pos=by_pos, direction=direction
            )
            expected = reference(model, kind, by_pos, direction)
            actual = result.per_prompt.reshape(-1, BATCH)
            torch.testing.assert_close(actual, expected, **EXACT, msg=f"{kind} by_pos={by_pos}")


@pytest.mark.parametrize("memory_budget", [1, 30_000, 10**12])
@pytest.mark.parametrize("kind", ["z", "resid_pre", "pattern", "k"])
def test_every_memory_budget_gives_the_same_numbers(kind, memory_budget):
    model = make_model("rotary, split qkv, attn result")
    result = activation_patch(
        model, kind, **PROMPTS, metric=logit_diff, by_pos=True, memory_budget=memory_budget
    )
    expected = reference(model, kind, True, "denoising")
    torch.testing.assert_close(result.per_prompt.reshape(-1, BATCH), expected, **EXACT)


def test_edits_at_several_hooks_and_positions_in_one_variant():
    # What path patching builds: a variant touching several layers, kinds and positions.
    model = make_model("2 layers, LN, MLP")
    base = base_run(model, CORRUPTED, logit_diff, [])
    _, clean = model.run_with_cache(CLEAN)
    z0, mlp1 = clean["blocks.0.attn.hook_z"], clean["blocks.1.hook_mlp_out"]
    heads = torch.tensor([[True, False], [False, True], [False, False]])
    positions = torch.tensor([[False, True, False, True, False]] * 2 + [[True] * 5])
    edits = [
        Edit("z", 0, heads[:, None, None, :, None] & positions[:, None, :, None, None], z0),
        Edit("mlp_out", 1, torch.tensor([False, True, True]).reshape(3, 1, 1, 1), mlp1),
    ]
    got = sweep(model, base, edits, 3, logit_diff)

    def by_hand(i):
        def patch_z(z, hook):
            return torch.where(edits[0].mask[i], z0, z)

        def patch_mlp(x, hook):
            return mlp1 if bool(edits[1].mask[i].any()) else x

        hooks = [("blocks.0.attn.hook_z", patch_z), ("blocks.1.hook_mlp_out", patch_mlp)]
        return logit_diff(model.run_with_hooks(CORRUPTED, fwd_hooks=hooks))

    torch.testing.assert_close(got, torch.stack([by_hand(i) for i in range(3)]), **EXACT)
    first = extents(edits, 3, N_POS)
    assert [(e.layer, e.start, e.local) for e in first] == [
        (0, 1, True),
        (0, 0, False),
        (1, 0, True),
    ]


def editing_metric(logits: torch.Tensor) -> torch.Tensor:
    """Writes into its input before reading it, as a metric masking a token might."""
    logits[:, :, 0] = 0.0
    return logit_diff(logits)


def view_metric(logits: torch.Tensor) -> torch.Tensor:
    """Returns a view of its input."""
    return logits[:, -1, 3]


def branching_metric(logits: torch.Tensor) -> torch.Tensor:
    """Branches on a value, which vmap cannot run: the variants are measured one by one."""
    diff = logit_diff(logits)
    return diff if bool(diff.sum() > -1e9) else -diff


def vmap_shy_metric(logits: torch.Tensor) -> torch.Tensor:
    """Other numbers under vmap (as hidden state might give): the check against a plain
    call on a stack's first variant sees it, and the variants are measured one by one."""
    return logit_diff(logits) + float(torch._C._functorch.is_batchedtensor(logits))


@pytest.mark.parametrize("metric", [editing_metric, view_metric, branching_metric, vmap_shy_metric])
def test_a_metric_editing_or_viewing_its_logits_gets_the_reference_numbers(metric):
    # Variants are measured on stacks of their logits (vmapped) or one at a time on one
    # logits tensor: neither a metric's own writes nor a value that views the tensor may
    # leak into another variant, and a metric vmap cannot run is run variant by variant.
    model = make_model("2 layers, LN, MLP")
    _, cache = model.run_with_cache(CLEAN)
    components = component_grid(model, "z", N_POS, True).components
    expected = reference_sweep(model, CORRUPTED, cache, components, metric)
    result = activation_patch(model, "z", **PROMPTS, metric=metric, by_pos=True)
    torch.testing.assert_close(result.per_prompt.reshape(-1, BATCH), expected, **EXACT)


def test_patching_the_whole_residual_stream_gives_the_other_run():
    model = make_model("2 layers, LN, MLP")
    kwargs = dict(**PROMPTS, metric=logit_diff, by_pos=False)
    denoised = activation_patch(model, "resid_pre", **kwargs)
    noised = activation_patch(model, "resid_pre", **kwargs, direction="noising")
    torch.testing.assert_close(denoised.normalised, torch.ones(2, dtype=torch.float64), **EXACT)
    torch.testing.assert_close(noised.normalised, torch.zeros(2, dtype=torch.float64), **EXACT)


def test_result_is_labelled_with_baselines():
    model = make_model("2 layers, LN, MLP")
    result = activation_patch(model, "z", **PROMPTS, metric=logit_diff, by_pos=True)
    assert result.axes == ("layer", "pos", "head")
    assert result.shape == (2, N_POS, 2)
    assert result.labels[1] == tuple(str(p) for p in range(N_POS))
    torch.testing.assert_close(result.clean, logit_diff(model(CLEAN)), **EXACT)
    torch.testing.assert_close(result.corrupted, logit_diff(model(CORRUPTED)), **EXACT)
    gap = result.clean.mean() - result.corrupted.mean()
    expected = (result.per_prompt.mean(-1) - result.corrupted.mean()) / gap
    torch.testing.assert_close(result.normalised, expected, **EXACT)
    assert result.label((1, 4, 0)) == "L1H0 pos 4"
    assert Component("z", 1, head=0, pos=4).label() == "z L1H0 pos 4"
    assert "z [layer=2, pos=5, head=2]" in repr(result)
    by_layer = activation_patch(model, "resid_pre", **PROMPTS, metric=logit_diff)
    assert by_layer.label((1, 3)) == "L1 pos 3"


def test_leaves_no_hooks_and_does_not_touch_its_inputs():
    model = make_model("2 layers, LN, MLP")
    clean, corrupted = CLEAN.clone(), CORRUPTED.clone()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    activation_patch(model, "pattern", clean_tokens=clean, corrupted_tokens=corrupted,
                     metric=logit_diff, by_pos=True)  # fmt: skip
    assert model.attached_hooks() == []
    assert torch.equal(clean, CLEAN) and torch.equal(corrupted, CORRUPTED)
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())


def test_hooks_are_detached_when_the_metric_fails_midway():
    model = make_model("2 layers, LN, MLP")
    calls = []

    def flaky(logits):
        calls.append(1)
        if len(calls) > 2:
            raise RuntimeError("metric broke")
        return logit_diff(logits)

    with pytest.raises(RuntimeError, match="metric broke"):
        activation_patch(model, "z", **PROMPTS, metric=flaky)
    assert model.attached_hooks() == []


def test_transformer_lens_argument_order_is_an_error_not_a_reversed_direction():
    model = make_model("2 layers, LN, MLP")
    _, clean_cache = model.run_with_cache(CLEAN)
    # TransformerLens: get_act_patch_...(model, corrupted_tokens, clean_cache, metric).
    with pytest.raises(TypeError, match="positional"):
        activation_patch(model, CORRUPTED, clean_cache, logit_diff)
    with pytest.raises(TypeError, match=r"got an ActivationCache.*TransformerLens"):
        activation_patch(model, clean_tokens=clean_cache, corrupted_tokens=CORRUPTED,
                         metric=logit_diff)  # fmt: skip


def test_equal_clean_and_corrupted_warn_that_normalised_is_nan():
    model = make_model("2 layers, LN, MLP")
    with pytest.warns(UserWarning, match=r"same mean metric.*tokens are equal.*NaN"):
        result = activation_patch(
            model, clean_tokens=CLEAN, corrupted_tokens=CLEAN, metric=logit_diff
        )
    assert bool(result.normalised.isnan().all())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        activation_patch(model, **PROMPTS, metric=logit_diff)


def test_clean_and_corrupted_of_different_shapes_is_an_error():
    model = make_model("2 layers, LN, MLP")
    with pytest.raises(ValueError, match=r"clean tokens have shape \(2, 5\).*\(2, 4\)"):
        activation_patch(
            model, clean_tokens=CLEAN, corrupted_tokens=CORRUPTED[:, :4], metric=logit_diff
        )


def test_metric_without_one_value_per_prompt_is_an_error():
    model = make_model("2 layers, LN, MLP")
    with pytest.raises(ValueError, match=r"shape \(2,\); got shape \(\).*mean"):
        activation_patch(model, **PROMPTS, metric=lambda logits: logit_diff(logits).mean())
    with pytest.raises(TypeError, match="got float"):
        activation_patch(model, **PROMPTS, metric=lambda logits: 1.0)


def test_kind_the_model_lacks_is_an_error_naming_the_kinds_it_has():
    model = make_model("attention-only, no norm, split qkv")
    with pytest.raises(ValueError, match=r"no 'mlp_out' \(it is attention-only\).*resid_pre"):
        activation_patch(model, "mlp_out", **PROMPTS, metric=logit_diff)
    with pytest.raises(ValueError, match=r"unknown component kind 'atn_out'.*'attn_out'"):
        activation_patch(model, "atn_out", **PROMPTS, metric=logit_diff)


def test_kinds_a_block_shape_lacks_are_errors_saying_why():
    parallel = make_model("parallel blocks, gated MLP")
    assert "pre_linear" in available_kinds(parallel)
    with pytest.raises(ValueError, match=r"no 'resid_mid' \(its blocks are parallel.*pre_linear"):
        activation_patch(parallel, "resid_mid", **PROMPTS, metric=logit_diff)
    with pytest.raises(ValueError, match=r"no 'pre_linear' \(its MLP is not gated"):
        activation_patch(
            make_model("2 layers, LN, MLP"), "pre_linear", **PROMPTS, metric=logit_diff
        )


def test_bad_direction_and_budget_are_errors():
    model = make_model("2 layers, LN, MLP")
    with pytest.raises(ValueError, match="direction must be 'denoising' or 'noising'"):
        activation_patch(model, **PROMPTS, metric=logit_diff, direction="backwards")
    with pytest.raises(ValueError, match="memory_budget must be a positive number of bytes"):
        activation_patch(model, **PROMPTS, metric=logit_diff, memory_budget=0)


def test_the_reference_region_is_the_component():
    every = slice(None)
    assert region(Component("z", 1, head=3, pos=2)) == (every, 2, 3, every)
    assert region(Component("pattern", 0, head=1, pos=4)) == (every, 1, 4, every)
    assert region(Component("resid_pre", 0)) == (slice(None),) * 3
