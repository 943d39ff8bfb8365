"""Tiny seeded models of each family's block shape, shared across the suite.

One config per shape that a real family needs (no weights are imported here; see
tests/hf/test_hf_families.py for that): every gain and bias is drawn at random
(`randomize_parameters`), so that an analysis which forgets one gives a wrong answer.
float64 throughout, where exactness is checked to 1e-10.

    llama   RMSNorm, gated SiLU MLP, grouped-query attention (4 query / 2 kv heads), rotary
    neox    parallel attention + MLP, partial rotary (2 of 4 dims), LayerNorm
    gemma2  RMSNorm before and after each sublayer, score and logit soft caps, a local
            (windowed) layer then a global one, gated GELU, grouped-query attention
    olmo2   RMSNorm after each sublayer only, q/k norm over all heads, grouped-query
    qwen3   per-head q/k norm, d_head (6) != d_model / n_heads (4), grouped-query

tests/core/test_families_models.py checks that each model has the shape it claims.
"""

import functools

import torch

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core.cache import ActivationCache
from hookedattn.testing.models import randomize_parameters

_BASE = dict(n_layers=2, d_model=16, n_ctx=16, d_vocab=23, d_mlp=24, dtype="float64", seed=0)
_GQA = dict(n_heads=4, d_head=4, n_key_value_heads=2)
_ROTARY = dict(positional_embedding_type="rotary")

FAMILIES: dict[str, dict] = {
    "llama": dict(**_GQA, **_ROTARY, normalization_type="RMS", gated_mlp=True, act_fn="silu"),
    "neox": dict(
        n_heads=4,
        d_head=4,
        **_ROTARY,
        rotary_dim=2,
        parallel_attn_mlp=True,
        normalization_type="LN",
        act_fn="gelu",
    ),
    "gemma2": dict(
        **_GQA,
        **_ROTARY,
        normalization_type="RMS",
        normalization_placement="pre_and_post",
        attn_scores_soft_cap=2.0,
        output_logits_soft_cap=3.0,
        window_size=3,
        attn_types=("local", "global"),
        gated_mlp=True,
        act_fn="gelu_new",
    ),
    "olmo2": dict(
        **_GQA,
        **_ROTARY,
        normalization_type="RMS",
        normalization_placement="post",
        use_qk_norm=True,
        qk_norm_per_head=False,
        gated_mlp=True,
        act_fn="silu",
    ),
    "qwen3": dict(
        n_heads=4,
        d_head=6,
        n_key_value_heads=2,
        **_ROTARY,
        normalization_type="RMS",
        use_qk_norm=True,
        gated_mlp=True,
        act_fn="silu",
    ),
}
# Longer than gemma2's window of 3, so that the window blocks keys.
TOKENS = torch.randint(0, 23, (2, 9), generator=torch.Generator().manual_seed(0))


def family_model(name: str, **overrides: object) -> HookedTransformer:
    """A fresh tiny model of family `name`, every weight, bias and gain random (seeded)."""
    cfg = HookedTransformerConfig(**{**_BASE, **FAMILIES[name], **overrides})
    return randomize_parameters(HookedTransformer(cfg), scale=0.5, seed=1)


@functools.cache
def family_run(name: str) -> tuple[HookedTransformer, torch.Tensor, ActivationCache]:
    """`(model, logits, cache)` of one forward on `TOKENS`, built once per session.

    Shared: callers must not change the model (take `family_model(name)` for that).
    """
    model = family_model(name)
    with torch.no_grad():
        logits, cache = model.run_with_cache(TOKENS)
    return model, logits, cache
