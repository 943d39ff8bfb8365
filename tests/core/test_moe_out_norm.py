"""A norm of the mixture of experts' whole output before it is added (`moe_out_norm`, A.X-K1's
`post_mlp_layernorm`): the blocks with experts hold it as their `ln2_post`, the dense blocks
none. Checked in float64 against the mixture written out token by token (`moe_by_token`) and
an RMS norm written out from its formula; the residual stream still sums."""

import pytest
import torch
from helpers.moe import TOKENS, moe_by_token, moe_model

from hookedattn import HookedTransformerConfig
from hookedattn.core.components.norm import NoNorm, RMSNorm

EPS = 1e-5  # the config's default


def _model():
    # Block 0 keeps a dense MLP, block 1 holds the experts and a shared expert.
    return moe_model(moe_out_norm=True, n_dense_layers=1, d_mlp_dense=12, d_mlp_shared=10)


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return w * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + EPS)


def test_only_the_blocks_with_experts_hold_the_output_norm() -> None:
    model = _model()
    assert isinstance(model.blocks[0].ln2_post, NoNorm)
    assert isinstance(model.blocks[1].ln2_post, RMSNorm)


def test_mlp_out_is_the_normed_sum_of_routed_and_shared_experts() -> None:
    model = _model()
    _, cache = model.run_with_cache(TOKENS)
    block = model.blocks[1]
    mlp_in = _rms(cache["blocks.1.hook_resid_mid"], block.ln2.w)
    want = _rms(moe_by_token(block.mlp, mlp_in), block.ln2_post.w)
    torch.testing.assert_close(cache["blocks.1.hook_mlp_out"], want, rtol=0, atol=1e-12)


def test_residual_stream_and_its_decomposition_sum() -> None:
    from analysis import decompose_resid

    model = _model()
    _, cache = model.run_with_cache(TOKENS)
    mid, out = cache["blocks.1.hook_resid_mid"], cache["blocks.1.hook_mlp_out"]
    torch.testing.assert_close(cache["blocks.1.hook_resid_post"], mid + out, rtol=0, atol=1e-12)
    final = cache["blocks.1.hook_resid_post"]
    for granularity in ("sublayer", "expert"):  # each expert's write through the norm
        decomposition = decompose_resid(model, cache, granularity=granularity)
        torch.testing.assert_close(decomposition.components.sum(0), final, rtol=0, atol=1e-10)


def test_output_norm_needs_experts() -> None:
    with pytest.raises(ValueError, match="moe_out_norm is a mixture-of-experts setting"):
        HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=4, d_head=4, d_vocab=5, d_mlp=8,
                                moe_out_norm=True)  # fmt: skip


def test_output_norm_needs_pre_norms() -> None:
    with pytest.raises(ValueError, match=r"every block placed 'pre'.*'pre_and_post'"):
        moe_model(moe_out_norm=True, normalization_placement="pre_and_post")


def test_fold_layer_norm_is_refused_naming_the_output_norm() -> None:
    from hookedattn.core.processing import fold_layer_norm

    with pytest.raises(ValueError, match="moe_out_norm"):
        fold_layer_norm(_model())
