"""q/k norms in some blocks only (`qk_norm_layers`, Llama 4's rotating blocks): those blocks
norm their queries and keys, the others read them as projected. Checked in float64 against
an RMS norm written out from its formula."""

import pytest
import torch

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core.components.norm import NoNorm, RMSNorm
from hookedattn.testing.models import randomize_parameters

EPS = 1e-5
TOKENS = torch.randint(0, 19, (2, 6), generator=torch.Generator().manual_seed(2))


def _model() -> HookedTransformer:
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=16, n_heads=4, d_head=4, n_ctx=32, d_vocab=19, d_mlp=8,
        act_fn="silu", normalization_type="RMS", positional_embedding_type="rotary",
        use_qk_norm=True, qk_norm_after_rotary=True, qk_norm_layers=(True, False),
        rotary_layers=(True, False), dtype="float64", seed=0,
    )  # fmt: skip
    return randomize_parameters(HookedTransformer(cfg), scale=0.5, seed=1)


def test_only_the_listed_blocks_hold_q_k_norms() -> None:
    model = _model()
    assert isinstance(model.blocks[0].attn.q_norm, RMSNorm)
    assert isinstance(model.blocks[0].attn.k_norm, RMSNorm)
    assert isinstance(model.blocks[1].attn.q_norm, NoNorm)
    assert isinstance(model.blocks[1].attn.k_norm, NoNorm)


def test_normed_block_norms_its_rotated_queries() -> None:
    model = _model()
    _, cache = model.run_with_cache(TOKENS)
    rot_q, w = cache["blocks.0.attn.hook_rot_q"], model.blocks[0].attn.q_norm.w
    want = w * rot_q / torch.sqrt(rot_q.pow(2).mean(-1, keepdim=True) + EPS)
    torch.testing.assert_close(cache["blocks.0.attn.q_norm.hook_out"], want, rtol=0, atol=1e-12)


def test_every_residual_identity_holds() -> None:
    from hookedattn.testing import assert_residual_identities

    model = _model()
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    assert_residual_identities(model, cache)


def test_per_block_norms_need_q_k_norms() -> None:
    with pytest.raises(ValueError, match="qk_norm_layers says which blocks"):
        HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=4, d_head=4, d_vocab=5,
                                attn_only=True, qk_norm_layers=(True,))  # fmt: skip


def test_per_block_norms_are_one_flag_per_block() -> None:
    with pytest.raises(ValueError, match=r"qk_norm_layers must be 2 booleans"):
        HookedTransformerConfig(n_layers=2, d_model=8, n_ctx=4, d_head=4, d_vocab=5,
                                attn_only=True, use_qk_norm=True,
                                qk_norm_layers=(True,))  # fmt: skip
