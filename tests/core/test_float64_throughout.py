"""`hookedattn.testing.float64_throughout`: within it, code that asks torch for float32 gets
float64, so a float64 model written with float32 steps (as `transformers`' RMSNorms and
softmaxes are) computes in float64 all the way; outside it, nothing changes."""

import pytest
import torch

from hookedattn.testing import float64_throughout


def rms_norm_as_transformers_writes_it(x: torch.Tensor) -> torch.Tensor:
    """An RMSNorm that normalises in float32 whatever its input's dtype, then casts back."""
    wide = x.to(torch.float32)
    return (wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


def rms_norm_float64(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(0), dtype=torch.float64)


def test_a_float32_step_rounds_outside_the_context(x):
    delta = (rms_norm_as_transformers_writes_it(x) - rms_norm_float64(x)).abs().max()
    assert 1e-9 < delta < 1e-5


def test_the_same_step_is_float64_inside_it(x):
    with float64_throughout():
        got = rms_norm_as_transformers_writes_it(x)
    assert torch.equal(got, rms_norm_float64(x))


def test_a_softmax_asked_for_in_float32_is_float64(x):
    with float64_throughout():
        got = torch.nn.functional.softmax(x, dim=-1, dtype=torch.float32)
    assert got.dtype == torch.float64
    assert torch.equal(got, x.softmax(dim=-1))


def test_float_and_factories_are_float64(x):
    with float64_throughout():
        assert x.float().dtype == torch.float64
        assert torch.zeros(2, dtype=torch.float32).dtype == torch.float64
        assert torch.ones(2).dtype == torch.float64  # the default dtype
        assert torch.arange(4, dtype=torch.int64).float().dtype == torch.float64
        assert x.to("cpu", torch.float32).dtype == torch.float64


def test_half_precision_and_integers_are_left_as_asked(x):
    with float64_throughout():
        assert x.to(torch.bfloat16).dtype == torch.bfloat16
        assert torch.zeros(2, dtype=torch.int32).dtype == torch.int32


def test_the_default_dtype_and_mode_end_with_the_context_even_on_error(x):
    with pytest.raises(RuntimeError, match="inside"), float64_throughout():
        raise RuntimeError("inside")
    assert torch.get_default_dtype() == torch.float32
    assert x.float().dtype == torch.float32
