"""Pairs of models with the same weights, one on the fused kernels and one written out, over
the block shapes the kernels must cover; shared by the tests of the fused kernels, the
finite guard and generation."""

import torch

from hookedattn import HookedTransformer, HookedTransformerConfig

BASE = dict(n_layers=2, d_model=32, n_heads=4, d_head=8, n_ctx=40, d_vocab=29, d_mlp=48)
VARIANTS = {
    "gpt2": {},
    "attn-only": {"attn_only": True, "normalization_type": "LNPre"},
    "llama": {
        "normalization_type": "RMS",
        "positional_embedding_type": "rotary",
        "gated_mlp": True,
        "act_fn": "silu",
        "n_key_value_heads": 2,
    },
    "neox": {"positional_embedding_type": "rotary", "rotary_dim": 4, "parallel_attn_mlp": True},
    "mistral-window": {
        "normalization_type": "RMS",
        "positional_embedding_type": "rotary",
        "n_key_value_heads": 1,
        "window_size": 3,
    },
    "olmo2": {
        "normalization_type": "RMS",
        "normalization_placement": "post",
        "positional_embedding_type": "rotary",
        "use_qk_norm": True,
        "qk_norm_per_head": False,
    },
    "split-inputs": {
        "use_split_qkv_input": True,
        "n_key_value_heads": 2,
        "normalization_type": "RMSPre",
    },
}


def pair(overrides: dict, dtype: torch.dtype) -> tuple[HookedTransformer, HookedTransformer]:
    """The same random weights (gains and biases perturbed), fused and written out."""
    cfg = HookedTransformerConfig(**{**BASE, "seed": 0, "dtype": dtype, **overrides})
    fused = HookedTransformer(cfg)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in fused.parameters():
            param += 0.1 * torch.randn(param.shape, generator=generator).to(dtype)
    written = HookedTransformer(cfg.replace(use_fused_kernels=False))
    written.load_state_dict(fused.state_dict())
    return fused, written
