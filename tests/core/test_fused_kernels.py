"""Idle hook points cost nothing: where nothing reads a layer's scores, pattern or norm, the
fused kernels run, and they agree with the written-out path to the dtype's rounding."""

import pytest
import torch
from helpers.fused import VARIANTS, pair
from torch.profiler import ProfilerActivity, profile

from hookedattn import HookedTransformer, KeyValueCache

TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-5}
TOKENS = torch.randint(0, 29, (3, 11), generator=torch.Generator().manual_seed(2))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("variant", VARIANTS)
def test_fused_and_written_out_forwards_agree(variant, dtype):
    fused, written = pair(VARIANTS[variant], dtype)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(fused(TOKENS), written(TOKENS), rtol=tol, atol=tol)


@pytest.mark.parametrize("variant", VARIANTS)
def test_fused_and_written_out_agree_on_a_left_padded_batch(variant):
    fused, written = pair(VARIANTS[variant], torch.float64)
    mask = torch.ones_like(TOKENS)
    mask[0, :4] = 0
    mask[1, :1] = 0
    torch.testing.assert_close(
        fused(TOKENS, attention_mask=mask),
        written(TOKENS, attention_mask=mask),
        rtol=1e-10,
        atol=1e-10,
    )


@pytest.mark.parametrize("variant", VARIANTS)
def test_fused_and_written_out_agree_token_by_token_with_a_kv_cache(variant):
    fused, written = pair(VARIANTS[variant], torch.float64)
    steps = []
    for model in (fused, written):
        cache = KeyValueCache.empty(model.cfg, batch=3)
        model(TOKENS[:, :6], past_kv_cache=cache)
        steps.append(
            torch.cat([model(TOKENS[:, i : i + 1], past_kv_cache=cache) for i in range(6, 11)], 1)
        )
    torch.testing.assert_close(steps[0], steps[1], rtol=1e-10, atol=1e-10)


def kernel_calls(model: HookedTransformer, fwd_hooks: list | None = None) -> dict[str, int]:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        model.run_with_hooks(TOKENS, fwd_hooks=fwd_hooks or [])
    names = ("aten::scaled_dot_product_attention", "aten::layer_norm", "aten::softmax")
    return {name: sum(e.count for e in prof.key_averages() if e.key == name) for name in names}


def test_idle_hook_points_run_the_fused_kernels():
    fused, _ = pair({}, torch.float32)
    calls = kernel_calls(fused)
    assert calls["aten::scaled_dot_product_attention"] == 2  # one per layer
    assert calls["aten::layer_norm"] == 5  # ln1, ln2 per layer and ln_final
    assert calls["aten::softmax"] == 0


def test_a_hook_on_one_layers_pattern_writes_out_that_layer_only():
    fused, _ = pair({}, torch.float32)
    calls = kernel_calls(fused, [("blocks.1.attn.hook_pattern", lambda p, hook: None)])
    assert calls["aten::scaled_dot_product_attention"] == 1
    assert calls["aten::softmax"] == 1


def test_use_fused_kernels_false_writes_everything_out():
    _, written = pair({}, torch.float32)
    calls = kernel_calls(written)
    assert calls["aten::scaled_dot_product_attention"] == 0 and calls["aten::layer_norm"] == 0


def test_with_fused_kernels_off_a_cached_run_equals_the_plain_forward_bit_for_bit():
    _, written = pair(VARIANTS["llama"], torch.float32)
    logits, _ = written.run_with_cache(TOKENS)
    assert torch.equal(logits, written(TOKENS))


def test_a_nan_value_in_a_masked_position_takes_the_written_out_path():
    fused, written = pair({}, torch.float64)

    def poison(v, hook):
        v[:, 7] = float("nan")
        return v

    hooks = [("blocks.0.attn.hook_v", poison)]
    out = fused.run_with_hooks(TOKENS, fwd_hooks=hooks)
    assert out[:, :7].isfinite().all()
    torch.testing.assert_close(out[:, :7], written.run_with_hooks(TOKENS, fwd_hooks=hooks)[:, :7])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_a_nan_query_reaches_its_own_position_on_the_fused_path(dtype):
    # torch's CPU kernel returns 0, not NaN, for a NaN query at short lengths (float32 up
    # to 5 positions, float64 up to 3): the guard must see the query, not only z.
    fused, written = pair({"attn_only": True, "n_layers": 1}, dtype)
    tokens = TOKENS[:, :3]

    def poison(q, hook):
        q[:, 2, 1, 0] = float("nan")
        return q

    hooks = [("blocks.0.attn.hook_q", poison)]
    for model in (fused, written):
        out = model.run_with_hooks(tokens, fwd_hooks=hooks)
        assert out[:, 2].isnan().all() and out[:, :2].isfinite().all()


def _untied(model: HookedTransformer) -> HookedTransformer:
    # Each q/k/v parameter given storage of its own: the fused product copies them again.
    with torch.no_grad():
        for block in model.blocks:
            for param in block.attn.parameters(recurse=False):
                param.data = param.data.clone()
    return model


def test_kept_fused_weights_see_an_in_place_weight_edit():
    fused, written = pair(VARIANTS["llama"], torch.float64)
    _untied(fused)
    with torch.no_grad(), fused.keeping_fused_weights():
        before = fused(TOKENS)
        for model in (fused, written):
            model.blocks[0].attn.W_Q[0].mul_(2.0)
            model.blocks[0].attn._W_K.add_(0.5)
        after = fused(TOKENS)
    assert not torch.allclose(before, after)
    torch.testing.assert_close(after, written(TOKENS), rtol=1e-10, atol=1e-10)


def test_fused_weights_are_freed_when_the_scope_ends():
    fused, _ = pair({}, torch.float32)
    _untied(fused)
    with torch.no_grad(), fused.keeping_fused_weights():
        fused(TOKENS)
        assert fused.blocks[0].attn.fused_qkv._kept is not None
    assert all(block.attn.fused_qkv._kept is None for block in fused.blocks)


def test_gradients_reach_the_weights_through_the_fused_product():
    fused, written = pair(VARIANTS["llama"], torch.float64)
    for model in (fused, written):
        model(TOKENS, return_type="loss").backward()
    for (name, a), (_, b) in zip(fused.named_parameters(), written.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-8, atol=1e-10, msg=name)
