"""bfloat16 and float16 forwards against float32, within a stated, measured tolerance.

The half-precision model and its float32 twin hold the same weights (the half ones, upcast),
so the comparison measures the forward's rounding alone, not the weights'. The error is
stated in units of the dtype's machine epsilon (`torch.finfo(dtype).eps`: 2^-7 for
bfloat16, 2^-10 for float16) relative to the RMS of the float32 logits; in those units the
two dtypes' errors are alike, as rounding errors should be.

Measured (torch 2.13 CPU, 1 thread; tokens [4 32] on the tiny models, seeds 0-9 of each
variant, both paths; tokens [4 128] on the shipped models, seeds 0-3):

    relative RMS error             worst 2.2 eps (tiny)   3.6 eps (shipped)
    largest error / RMS of logits  worst 19 eps (tiny)    99 eps (shipped; longer tails)

The bounds below are those worst cases with a margin of about 1.6 to 2.
"""

import pytest
import torch

from hookedattn.testing import random_tiny_model, random_tokens

VARIANTS = {
    "gpt2": {"act_fn": "gelu"},
    "llama": {
        "normalization_type": "RMS",
        "positional_embedding_type": "rotary",
        "gated_mlp": True,
        "act_fn": "silu",
        "n_key_value_heads": 2,
    },
    "attn_only": {"attn_only": True, "normalization_type": "LNPre"},
    "neox": {
        "parallel_attn_mlp": True,
        "positional_embedding_type": "rotary",
        "rotary_dim": 2,
        "act_fn": "gelu_new",
    },
}
PATHS = {"fused": True, "written_out": False}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
# (relative RMS error, largest error over the logits' RMS), in machine epsilons.
TINY_BOUND, SHIPPED_BOUND = (4.0, 32.0), (6.0, 160.0)


def errors_in_eps(model, dtype: torch.dtype, tokens: torch.Tensor) -> tuple[float, float]:
    """The half forward's error against float32 on the same (half) weights, in eps units."""
    half = model.copy().to(dtype)
    with torch.no_grad():
        expected = half.copy().to(torch.float32)(tokens)
        got = half(tokens)
    assert got.dtype == dtype
    error, rms = got.float() - expected, expected.pow(2).mean().sqrt()
    eps = torch.finfo(dtype).eps
    return float(error.pow(2).mean().sqrt() / rms / eps), float(error.abs().max() / rms / eps)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_a_half_precision_forward_is_float32_to_a_few_epsilons(variant, path, dtype):
    # Weights of init scale (0.2 for d_model 32): much larger random weights make sharp,
    # nearly tied softmaxes whose rounding flips which key wins, which is not a bug.
    model = random_tiny_model(
        scale=0.2, dtype=torch.float32, d_model=32, n_ctx=32, use_fused_kernels=PATHS[path],
        **VARIANTS[variant],
    )  # fmt: skip
    rms, largest = errors_in_eps(model, DTYPES[dtype], random_tokens(32, 4, 32, seed=0))
    assert rms <= TINY_BOUND[0] and largest <= TINY_BOUND[1], (rms, largest)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", ["bytes-gelu-2l", "bytes-attn-only-2l"])
def test_a_shipped_models_half_precision_forward_is_float32_to_a_few_epsilons(
    name, dtype, pretrained
):
    model = pretrained(name)  # shared: only copies of it are cast
    rms, largest = errors_in_eps(model, DTYPES[dtype], random_tokens(259, 4, 128, seed=1))
    assert rms <= SHIPPED_BOUND[0] and largest <= SHIPPED_BOUND[1], (rms, largest)


def test_the_bound_sees_an_error_of_a_few_epsilons_in_the_residual_stream():
    # A bound that could not fail would pin nothing: an error of 2^-4 of the stream's size
    # (8 bfloat16 epsilons, twice the bound), in a direction no norm removes, lands outside.
    model = random_tiny_model(scale=0.2, dtype=torch.float32, d_model=32, n_ctx=32)
    tokens = random_tokens(32, 4, 32, seed=0)
    half = model.copy().to(torch.bfloat16)
    nudge = lambda x, hook: x + 2**-4 * x.roll(1, dims=-1)
    with torch.no_grad():
        expected = half.copy().to(torch.float32)(tokens)
        got = half.run_with_hooks(tokens, fwd_hooks=[("blocks.1.hook_resid_mid", nudge)])
    error = (got.float() - expected).pow(2).mean().sqrt() / expected.pow(2).mean().sqrt()
    assert float(error) / torch.finfo(torch.bfloat16).eps > TINY_BOUND[0]
