"""hookedattn.testing: the helpers pass on what is right and say what is wrong, and where;
a NaN or an infinity in a comparison fails it unless NaN on both sides is asked for."""

import dataclasses
import re
import subprocess
import sys
from functools import partial

import pytest
import torch

import hookedattn.core.tolerances
from hookedattn import ActivationCache, KeyValueCache
from hookedattn.testing import (
    assert_close_cache,
    assert_decomposes,
    assert_no_hooks,
    assert_residual_identities,
    published_constants,
    random_tiny_model,
    tolerance,
)

VARIANTS = {
    "default": {},
    "attn_only": {"attn_only": True},
    "rotary_rms": {"positional_embedding_type": "rotary", "normalization_type": "RMS"},
    "no_norm_gelu_new": {"normalization_type": None, "act_fn": "gelu_new"},
    "per_head_hooks": {
        "use_attn_result": True,
        "use_split_qkv_input": True,
        "use_hook_mlp_in": True,
    },
    "attn_in": {"use_attn_in": True, "positional_embedding_type": "none"},
}


# Every weight, bias and gain random: under unit gains and zero biases an identity cannot
# tell where (or whether) a gain or bias is applied.
make_model = partial(random_tiny_model, n_ctx=12, d_vocab=20, d_mlp=32)


TOKENS = torch.tensor([[1, 2, 3, 4, 5, 6, 7], [7, 6, 5, 4, 3, 2, 1]])
NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def clean() -> tuple:
    """The default model and its cache of TOKENS, for the tests that only read them."""
    model = make_model()
    return model, model.run_with_cache(TOKENS)[1]


def failure_message(check, *args) -> str:
    """What the AssertionError of `check(*args)` says; the test fails if it raises none."""
    with pytest.raises(AssertionError) as failure:
        check(*args)
    return str(failure.value)


def bumped(cache: ActivationCache, name: str, index: tuple, by: float) -> ActivationCache:
    """A copy of `cache` with `by` added to `cache[name]` at `index`."""
    value = cache[name].clone()
    value[index] += by
    return ActivationCache({**cache, name: value}, cache.n_layers, cache.has_batch_dim)


# --------------------------------------------------------- assert_residual_identities
# Activations no identity reaches: the norms' internals (recomputing a norm would call the
# model's own module), and q, k before rotation.
NOT_COVERED = r"hook_scale|ln_final\.hook_normalized|attn\.hook_[qk]"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("variant", VARIANTS)
def test_identities_hold_on_a_clean_forward_and_reach_every_activation(variant, dtype):
    model = make_model(dtype=dtype, **VARIANTS[variant])
    _, cache = model.run_with_cache(TOKENS)
    check = assert_residual_identities(model, cache)
    assert check.skipped == ()
    mentioned = set(re.findall(r"[\w.]+", " ".join(check.checked)))
    uncovered = [name for name in cache if name not in mentioned]
    if variant == "per_head_hooks":  # ln1 runs on q, k and v inputs; its hooks keep one
        uncovered = [n for n in uncovered if not re.search(r"ln1\.hook_(normalized|scale)$", n)]
    if variant != "rotary_rms":
        assert not any(re.search(r"attn\.hook_[qk]$", n) for n in uncovered)
    assert all(re.search(NOT_COVERED, n) for n in uncovered), uncovered


def test_a_perturbed_activation_fails_naming_the_identity_position_error_and_tolerance(clean):
    model, cache = clean
    broken = bumped(cache, "blocks.1.hook_resid_mid", (1, 3, 5), 0.25)
    message = failure_message(assert_residual_identities, model, broken)
    assert "blocks.1.hook_resid_mid == blocks.1.hook_resid_pre + blocks.1.hook_attn_out" in message
    assert "largest error 0.25 at batch 1, pos 3, d_model 5" in message
    assert "float64 tolerance" in message
    assert "1 of 224 elements out of tolerance" in message
    # resid_post is read from the clean resid_mid, so it fails too, second.
    assert message.index("[1] blocks.1.hook_resid_mid") < message.index(
        "[2] blocks.1.hook_resid_post == blocks.1.hook_resid_mid"
    )


def test_the_tolerance_is_the_cache_dtypes():
    model = make_model(dtype=torch.float32)
    _, cache = model.run_with_cache(TOKENS)
    name = "blocks.0.hook_attn_out"
    tol = tolerance(torch.float32)
    assert_residual_identities(model, bumped(cache, name, (0, 2, 1), tol.atol / 10))
    with pytest.raises(AssertionError, match="float32 tolerance"):
        assert_residual_identities(model, bumped(cache, name, (0, 2, 1), 1e-3))


def test_a_cast_cache_is_checked_at_the_looser_dtype():
    model = make_model(dtype=torch.bfloat16)
    _, cache = model.run_with_cache(TOKENS, dtype=torch.float64)
    check = assert_residual_identities(model, cache)
    assert check.tolerance.source == "bfloat16"


def test_pattern_rows_that_do_not_sum_to_one_are_located(clean):
    model, cache = clean
    broken = bumped(cache, "blocks.0.attn.hook_pattern", (0, 2, 4, 1), 0.1)
    assert re.search(
        r"blocks\.0\.attn\.hook_pattern rows sum to 1\n.*at batch 0, head 2, query_pos 4:",
        failure_message(assert_residual_identities, model, broken),
    )


def test_attention_to_future_keys_fails_the_causal_identity():
    model = make_model(attn_only=True, n_layers=1)
    uniform = lambda pattern, hook: torch.full_like(pattern, 1 / pattern.shape[-1])
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", uniform)]):
        _, cache = model.run_with_cache(TOKENS)
    with pytest.raises(AssertionError) as failure:
        assert_residual_identities(model, cache)
    message = str(failure.value)
    assert "[2] blocks.0.attn.hook_pattern is 0 on every key after its query" in message
    assert "rows sum to 1" not in message  # a uniform pattern is still a distribution
    assert "hook_z ==" not in message  # and z was computed from it


def test_an_ablation_breaks_only_the_identity_at_the_ablated_activation():
    model = make_model(use_attn_result=True)

    def zero_head_1(z, hook):
        z[:, :, 1] = 0
        return z

    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_z", zero_head_1)]):
        _, cache = model.run_with_cache(TOKENS)
    with pytest.raises(AssertionError) as failure:
        assert_residual_identities(model, cache)
    message = str(failure.value)
    assert message.startswith("1 of 49 residual-stream identities fail")
    assert (
        "[1] blocks.0.attn.hook_z == blocks.0.attn.hook_pattern @ blocks.0.attn.hook_v" in message
    )
    assert re.search(r"at batch \d, pos \d, head 1, d_head \d", message)  # the zeroed head


def test_identities_whose_activations_are_not_cached_are_skipped_and_listed():
    model = make_model()
    _, cache = model.run_with_cache(TOKENS, names_filter=lambda n: "resid" in n or "out" in n)
    check = assert_residual_identities(model, cache)
    assert (
        "blocks.0.hook_resid_mid == blocks.0.hook_resid_pre + blocks.0.hook_attn_out"
        in check.checked
    )
    assert "blocks.1.hook_resid_pre == blocks.0.hook_resid_post" in check.checked
    assert any(
        s.startswith("blocks.0.attn.hook_pattern rows sum to 1  [not cached") for s in check.skipped
    )
    assert "skip  blocks.0.attn.hook_pattern rows sum to 1" in repr(check)


def test_a_cache_with_nothing_to_check_fails():
    model = make_model()
    _, cache = model.run_with_cache(TOKENS, names_filter="blocks.0.attn.hook_q")
    with pytest.raises(AssertionError, match="none of the .* identities could be checked"):
        assert_residual_identities(model, cache)


def test_a_model_without_layers_has_no_identities_to_fail():
    model = make_model(n_layers=0)
    _, cache = model.run_with_cache(TOKENS)
    assert assert_residual_identities(model, cache).checked == ()


def test_pos_slice_and_kv_cache_runs_check_what_they_can():
    model = make_model()
    _, sliced = model.run_with_cache(TOKENS, pos_slice=-1)
    check = assert_residual_identities(model, sliced)
    assert any("hook_z == " in s and "pos_slice or a KV cache" in s for s in check.skipped)
    past = KeyValueCache.empty(model.cfg, batch=2)
    model(TOKENS[:, :4], past_kv_cache=past)
    _, continued = model.run_with_cache(TOKENS[:, 4:], past_kv_cache=past)
    check = assert_residual_identities(model, continued)
    assert "blocks.1.attn.hook_pattern is 0 on every key after its query" in check.checked


def test_a_cache_without_batch_axis_names_the_remaining_axes():
    model = make_model()
    _, cache = model.run_with_cache(TOKENS[:1], remove_batch_dim=True)
    name = "blocks.0.mlp.hook_post"
    broken = bumped(cache, name, (3, 7), -1.0)
    with pytest.raises(AssertionError, match=r"largest error 1 at pos 3, d_mlp 7"):
        assert_residual_identities(model, broken)


def test_a_config_whose_constant_is_not_the_published_one_fails_naming_it():
    model = make_model(eps=1e-6)  # TransformerLens 3.5.1's default is 1e-5
    _, cache = model.run_with_cache(TOKENS)
    message = failure_message(assert_residual_identities, model, cache)
    assert "[1] constant eps" in message
    assert "eps: the model's config has 1e-06, the check uses 1e-05" in message
    assert "constants=published_constants(d_head, <name>=<value>)" in message


def test_a_stated_constant_is_the_one_the_identities_use():
    model = make_model(eps=1e-2, attn_scale=3.0)
    _, cache = model.run_with_cache(TOKENS)
    stated = published_constants(model.cfg.d_head, eps=1e-2, attn_scale=3.0)
    check = assert_residual_identities(model, cache, constants=stated)
    assert "blocks.0.ln1.hook_scale == sqrt(mean((x - mean(x))^2) + 0.01) of x = " in " ".join(
        check.checked
    )
    # The same cache held to other constants fails the identities that use them.
    wrong = published_constants(model.cfg.d_head, eps=1e-3, attn_scale=3.0)
    message = failure_message(partial(assert_residual_identities, constants=wrong), model, cache)
    assert "blocks.0.ln1.hook_scale == sqrt(mean((x - mean(x))^2) + 0.001)" in message
    wrong = published_constants(model.cfg.d_head, eps=1e-2, attn_scale=2.0)
    message = failure_message(partial(assert_residual_identities, constants=wrong), model, cache)
    assert "blocks.0.attn.hook_attn_scores == " in message


@pytest.mark.parametrize(("built", "checked_as"), [("LN", "RMS"), ("RMS", "LN")])
def test_a_layernorm_and_an_rmsnorm_are_told_apart(built, checked_as):
    model = make_model(normalization_type=built)
    _, cache = model.run_with_cache(TOKENS)
    model.cfg = dataclasses.replace(model.cfg, normalization_type=checked_as)
    message = failure_message(assert_residual_identities, model, cache)
    assert "blocks.0.ln1.hook_scale == sqrt(mean(" in message


@pytest.mark.parametrize("name", ["blocks.1.ln2.w", "blocks.0.ln1.b", "ln_final.w"])
def test_a_gain_or_bias_changed_after_the_forward_breaks_its_norms_identity(name):
    model = make_model()
    _, cache = model.run_with_cache(TOKENS)
    with torch.no_grad():
        model.get_parameter(name).mul_(1.01)
    path = name.rsplit(".", 1)[0]
    message = failure_message(assert_residual_identities, model, cache)
    assert f"{path}.hook_out == {path}.hook_normalized * w + b" in message


@pytest.mark.parametrize("site", ["blocks.1.ln1.hook_scale", "ln_final.hook_normalized"])
def test_a_perturbed_norm_activation_fails_the_identity_written_from_its_input(site):
    model = make_model()
    _, cache = model.run_with_cache(TOKENS)
    index = (0, 3, 0) if site.endswith("scale") else (0, 3, 2)
    message = failure_message(assert_residual_identities, model, bumped(cache, site, index, 1e-6))
    assert f"[1] {site} == " in message


# ------------------------------------------------------------------- assert_no_hooks
def test_no_hooks_passes_after_scoped_hooks():
    model = make_model()
    with model.hooks(fwd_hooks=[("blocks.0.hook_resid_pre", lambda x, hook: None)]):
        model(TOKENS)
    model.run_with_hooks(TOKENS, fwd_hooks=[("blocks.1.attn.hook_z", lambda x, hook: None)])
    assert_no_hooks(model)


def test_a_leaked_hook_is_named_with_its_hook_point_and_definition():
    model = make_model()

    def ablate(x, hook):
        return torch.zeros_like(x)

    model.add_hook("blocks.1.attn.hook_z", ablate)
    with pytest.raises(AssertionError) as failure:
        assert_no_hooks(model)
    line = str(failure.value).splitlines()[1]
    defined_at = ablate.__code__.co_firstlineno
    assert re.fullmatch(
        rf"  fwd hook .*ablate \(tests/project/test_testing\.py:{defined_at}\) "
        r"at blocks\.1\.attn\.hook_z",
        line,
    )
    assert "reset_hooks()" in str(failure.value)


def test_permanent_hooks_fail_unless_allowed():
    model = make_model()
    model.add_perma_hook("hook_embed", lambda x, hook: None)
    assert_no_hooks(model, allow_permanent=True)
    with pytest.raises(AssertionError, match="permanent fwd hook .* at hook_embed"):
        assert_no_hooks(model)


# ----------------------------------------------------------------- assert_decomposes
def stream_parts(model, cache):
    """The final residual stream as the sum of everything written to it."""
    labels, parts = ["embed", "pos_embed"], [cache["hook_embed"], cache["hook_pos_embed"]]
    for layer in range(model.cfg.n_layers):
        labels += [f"L{layer}_attn", f"L{layer}_mlp"]
        parts += [cache["attn_out", layer], cache["mlp_out", layer]]
    return torch.stack(parts), labels, cache["resid_post", -1]


@dataclasses.dataclass(frozen=True)
class Decomposition:  # the shape of analysis.Decomposition, duck-typed
    components: torch.Tensor
    labels: tuple[str, ...]


def test_a_complete_decomposition_passes_as_tensor_or_object(clean):
    model, cache = clean
    parts, labels, target = stream_parts(model, cache)
    assert_decomposes(parts, target, labels)
    assert_decomposes(Decomposition(parts, tuple(labels)), target)


def test_a_missing_component_fails_with_position_and_the_largest_components_there(clean):
    model, cache = clean
    parts, labels, target = stream_parts(model, cache)
    without = Decomposition(parts[[0, 1, 3, 4, 5]], tuple(labels[i] for i in (0, 1, 3, 4, 5)))
    with pytest.raises(AssertionError) as failure:
        assert_decomposes(without, target)
    message = str(failure.value)
    error = (parts[2]).abs()
    worst = tuple(int(i) for i in torch.unravel_index(error.argmax(), error.shape))
    assert "the 5 components do not sum to the target:" in message
    where = f"batch {worst[0]}, pos {worst[1]}, d_model {worst[2]}"
    assert f"largest error {error.max().item():.3g} at {where}" in message
    assert "float64 tolerance" in message
    assert "largest components there: " in message


def test_a_missing_bias_is_recognised():
    model = make_model(use_attn_result=True)
    model.blocks[0].attn.b_O.data.normal_(generator=torch.Generator().manual_seed(1))
    _, cache = model.run_with_cache(TOKENS)
    heads = cache["result", 0].movedim(-2, 0)  # [head batch pos d_model], no b_O
    with pytest.raises(AssertionError, match="a constant term .* is missing"):
        assert_decomposes(heads, cache["attn_out", 0], [f"L0H{h}" for h in range(4)])


def test_a_component_counted_twice_is_recognised(clean):
    model, cache = clean
    parts, labels, target = stream_parts(model, cache)
    doubled = torch.cat([parts, parts[3:4]])
    with pytest.raises(
        AssertionError, match="the remainder is minus 'L0_mlp': is it counted twice"
    ):
        assert_decomposes(doubled, target, [*labels, "L0_mlp again"])


def test_an_analysis_decomposition_is_checked_by_its_labels():
    import analysis

    model = make_model()
    model.blocks[1].attn.b_O.data.normal_(generator=torch.Generator().manual_seed(1))
    _, cache = model.run_with_cache(TOKENS)
    decomposition = analysis.decompose_resid(model, cache, granularity="head")
    assert_decomposes(decomposition, cache["resid_post", -1])
    keep = [i for i, label in enumerate(decomposition.labels) if label != "L1_attn_bias"]
    without_bias = dataclasses.replace(
        decomposition,
        components=decomposition.components[keep],
        labels=tuple(decomposition.labels[i] for i in keep),
    )
    with pytest.raises(AssertionError) as failure:
        assert_decomposes(without_bias, cache["resid_post", -1])
    assert "at batch " in str(failure.value)  # a Decomposition's axes are named
    assert "a constant term (a bias such as b_O, b_out or b_U) is missing?" in str(failure.value)


def test_decomposition_shapes_and_labels_are_checked():
    parts = torch.zeros(3, 2, 5)
    with pytest.raises(ValueError, match=r"but the target has shape \(2, 4\)"):
        assert_decomposes(parts, torch.zeros(2, 4))
    with pytest.raises(ValueError, match="2 labels for 3 components"):
        assert_decomposes(parts, torch.zeros(2, 5), ["a", "b"])


@pytest.mark.parametrize(
    ("components", "target"),
    [
        ([[NAN, 1.0], [1.0, 1.0]], [2.0, 2.0]),  # a NaN component: the bound was NaN
        ([[1.0, 1.0], [1.0, 1.0]], [NAN, 2.0]),  # a NaN target
        ([[NAN, 1.0], [1.0, 1.0]], [NAN, 2.0]),  # both, not asked for
        ([[INF, 1.0], [-INF, 1.0]], [0.0, 2.0]),  # infinities that cancel to NaN
    ],
)
def test_assert_decomposes_fails_on_nan(components, target):
    parts = torch.tensor(components, dtype=torch.float64)
    with pytest.raises(AssertionError, match="do not sum to the target"):
        assert_decomposes(parts, torch.tensor(target, dtype=torch.float64))


def test_assert_decomposes_accepts_nan_on_both_sides_only_when_asked():
    parts = torch.tensor([[NAN, 1.0], [1.0, 1.0]], dtype=torch.float64)
    assert_decomposes(parts, torch.tensor([NAN, 2.0], dtype=torch.float64), equal_nan=True)


# ---------------------------------------------------------------- assert_close_cache
def test_caches_of_the_same_run_are_close():
    model = make_model()
    _, a = model.run_with_cache(TOKENS)
    _, b = model.copy().run_with_cache(TOKENS)
    assert_close_cache(a, b)
    assert_close_cache(a, b, names=[("pattern", 0), "blocks.1.hook_resid_post"])


def test_one_perturbed_activation_is_named_with_its_largest_error(clean):
    _, a = clean
    name = "blocks.1.attn.hook_pattern"
    message = failure_message(assert_close_cache, a, bumped(a, name, (1, 3, 5, 2), 0.5))
    assert message.startswith(
        f"1 of {len(a)} activations differ between cache_a and cache_b:\n[1] {name}"
    )
    assert "largest error 0.5 at batch 1, head 3, query_pos 5, key_pos 2: cache_a" in message


def test_the_earliest_difference_is_named_first():
    model = make_model()
    _, a = model.run_with_cache(TOKENS)
    halve = lambda pattern, hook: pattern / 2
    with model.hooks(fwd_hooks=[("blocks.0.attn.hook_pattern", halve)]):
        _, b = model.run_with_cache(TOKENS)
    with pytest.raises(
        AssertionError, match="the earliest in forward order is blocks.0.attn.hook_pattern"
    ):
        assert_close_cache(a, b)


def test_a_missing_activation_fails(clean):
    model, a = clean
    _, b = model.run_with_cache(TOKENS, names_filter=lambda n: "resid" in n)
    with pytest.raises(AssertionError, match="missing from cache_b: hook_embed, hook_pos_embed"):
        assert_close_cache(a, b)
    assert_close_cache(a, b, names=lambda n: "resid" in n)


NAME = "blocks.0.hook_resid_pre"


def cache_of(*values: float) -> ActivationCache:
    return ActivationCache({NAME: torch.tensor([[values]], dtype=torch.float64)}, n_layers=1)


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ((NAN, 1.0), (0.5, 1.0)),  # NaN in the cache under test
        ((0.5, 1.0), (NAN, 1.0)),  # NaN in the reference: the bound was NaN, so it passed
        ((NAN, 1.0), (NAN, 1.0)),  # both, but equal_nan was not asked for
        ((1.0, 1.0), (INF, 1.0)),  # a finite value against an infinity
    ],
)
def test_assert_close_cache_fails_on_nan_and_infinity(a, b):
    with pytest.raises(AssertionError, match=NAME):
        assert_close_cache(cache_of(*a), cache_of(*b))


def test_assert_close_cache_accepts_nan_on_both_sides_only_when_asked():
    assert_close_cache(cache_of(NAN, 1.0), cache_of(NAN, 1.0), equal_nan=True)
    assert_close_cache(cache_of(-INF, 1.0), cache_of(-INF, 1.0))
    with pytest.raises(AssertionError):
        assert_close_cache(cache_of(NAN, 1.0), cache_of(1.0, NAN), equal_nan=True)


# ------------------------------------------------------------------------ packaging
def test_tolerances_are_re_exported():
    assert tolerance is hookedattn.core.tolerances.tolerance


def test_importing_the_helpers_does_not_import_pytest():
    code = "import sys, hookedattn.testing; sys.exit('pytest' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], check=False).returncode == 0
