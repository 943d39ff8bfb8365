"""A hybrid's mixers in bfloat16 and float16: every kind runs and generates (the gated delta
rule's triangular solve has no half-precision kernel, so it runs in float32, as transformers
runs it), and the norms of their heads' reads take their mean of squares in float32."""

import copy

import pytest
import torch

from hookedattn.core.components.norm import rms_normalized
from tests.helpers.mixers import KIND_SETTINGS, hybrid_cfg, random_hybrid, unpadded_context

HALF = [torch.bfloat16, torch.float16]
TOKENS = torch.randint(0, 23, (2, 12), generator=torch.Generator().manual_seed(6))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("kind", list(KIND_SETTINGS))
def test_every_mixer_runs_and_generates_in_half_precision(kind, dtype):
    model = random_hybrid(hybrid_cfg((kind, "attention", kind), **KIND_SETTINGS[kind]), 5).to(dtype)
    with torch.no_grad():
        logits = model(TOKENS)
        tokens = model.generate(TOKENS[:, :6], max_new_tokens=3, stop_at_eos=False)
    assert logits.dtype == dtype and bool(logits.isfinite().all())
    assert tokens.shape == (2, 9)


@pytest.mark.parametrize("dtype, tolerance", [(torch.float16, 5e-3), (torch.bfloat16, 4e-2)])
def test_the_gated_delta_rule_in_half_precision_is_its_float64_rule_rounded(dtype, tolerance):
    """The mixer of a half-precision model, given the float64 model's input rounded: its
    mixing is float32 and its output within its dtype's rounding of the float64 one."""
    model = random_hybrid(hybrid_cfg(("gated_delta", "attention")), 5)
    exact, half = model.blocks[0].mixer, copy.deepcopy(model.blocks[0].mixer).to(dtype)
    x = torch.randn(2, 12, 12, generator=torch.Generator().manual_seed(7), dtype=torch.float64)
    context = unpadded_context(x)
    seen = {}
    keep = lambda value, hook: seen.setdefault(value.dtype, value)
    half.hook_mixing.add_hook(keep)
    with torch.no_grad():
        expected, got = exact(x, context), half(x.to(dtype), context)
    assert got.dtype == dtype and list(seen) == [torch.float32]
    assert float((got.double() - expected).abs().max()) <= tolerance * float(expected.abs().max())


@pytest.mark.parametrize("dtype", HALF)
def test_a_small_read_is_normed_by_its_float32_mean_of_squares(dtype):
    """Reads of 1e-4: their squares underflow float16 (and lose bfloat16's few digits)."""
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(8), dtype=torch.float64) * 1e-4
    expected = x / (x.pow(2).mean(-1, keepdim=True) + 1e-6).sqrt()
    got = rms_normalized(x.to(dtype), 1e-6)
    assert got.dtype == dtype
    rounding = 1e-3 if dtype == torch.float16 else 8e-3
    assert float((got.double() - expected).abs().max()) <= rounding * float(expected.abs().max())


def test_a_float64_read_is_normed_as_written():
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    expected = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.equal(rms_normalized(x, 1e-6), expected)
