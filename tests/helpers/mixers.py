"""Tiny hybrid models for the mixer tests (short convolution, Mamba-1, Mamba-2, gated delta
net): a config whose blocks hold the given kinds, the context of an unpadded batch, and
every parameter of a module drawn at random."""

from typing import Any

import torch

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.kernels import attention_context
from hookedattn.core.mixer_config import MixerConfig

D_MODEL = 12
# Mamba-2 / gated delta settings small enough to check against loops, grouped (2 groups).
SETTINGS = dict(d_conv=3, n_ssm_heads=4, d_ssm_head=6, d_state=5, n_ssm_groups=2)


def hybrid_cfg(
    kinds: tuple[str, ...], dtype: torch.dtype = torch.float64, **mixer: Any
) -> HookedTransformerConfig:
    """A model of `len(kinds)` blocks, block `i` holding `kinds[i]` ("attention" or a mixer
    kind), the mixers' settings `SETTINGS` changed by `mixer`."""
    return HookedTransformerConfig(
        n_layers=len(kinds), d_model=D_MODEL, n_ctx=32, d_vocab=23, n_heads=3, d_mlp=20,
        normalization_type="RMS", positional_embedding_type="rotary", gated_mlp=True,
        act_fn="silu", seed=0, dtype=dtype,
        mixers=MixerConfig(layers=kinds, **SETTINGS | mixer),
    )  # fmt: skip


def unpadded_context(x: torch.Tensor) -> Any:
    """The context of an unpadded batch like `x` (no KV cache, no window)."""
    return attention_context(x.shape[1], x.shape[0], x.shape[1], None, None, None, "cpu")


def randomised(module: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Every parameter drawn at random (biases, gains, A_log, D, dt_bias included)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=generator, dtype=p.dtype) * 0.5)
    return module


def random_hybrid(cfg: HookedTransformerConfig, seed: int) -> Any:
    """A model of `cfg` whose blocks' parameters are all drawn at random (`randomised`)."""
    from hookedattn import HookedTransformer

    model = HookedTransformer(cfg)
    for block in model.blocks:
        randomised(block, seed)
    return model


def assert_causal_and_float32_close(
    mixer: torch.nn.Module, single: torch.nn.Module, x: torch.Tensor
) -> None:
    """`mixer` (float64) gives its first 6 positions the same whatever comes after them, and
    `single`, the same module in float32 with `mixer`'s weights, is within 1e-5 of it."""
    context = unpadded_context(x)
    changed = x.clone()
    changed[:, 6:] += 1.0
    torch.testing.assert_close(
        mixer(changed, context)[:, :6], mixer(x, context)[:, :6], rtol=0, atol=0
    )
    single.load_state_dict({k: v.float() for k, v in mixer.state_dict().items()})
    with torch.no_grad():
        got, expected = single(x.float(), context).double(), mixer(x, context)
    assert float((got - expected).abs().max()) <= 1e-5 * float(expected.abs().max())
