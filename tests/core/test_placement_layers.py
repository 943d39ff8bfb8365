"""`placement_layers`: each block's norms placed on their own (OLMo Hybrid's gated delta net
blocks norm what their sublayers read, its attention blocks what theirs write), checked in
float64 against the norms written out here from the cached activations."""

import json

import pytest
import torch
from helpers.mixers import hybrid_cfg, random_hybrid

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core.processing import center_writing_weights, fold_layer_norm

KINDS = ("gated_delta", "attention", "gated_delta")
PLACEMENTS = ("pre", "post", "pre")
TOKENS = torch.randint(0, 23, (2, 8), generator=torch.Generator().manual_seed(3))


def model(placements: tuple[str, ...] = PLACEMENTS) -> HookedTransformer:
    cfg = hybrid_cfg(KINDS).replace(placement_layers=placements)
    return random_hybrid(cfg, seed=1)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def test_a_pre_block_norms_what_its_sublayers_read():
    m = model()
    with torch.no_grad():
        _, cache = m.run_with_cache(TOKENS)
    block, eps = m.blocks[0], m.cfg.eps
    read = _rms(cache["blocks.0.hook_resid_pre"], block.ln1.w, eps)
    torch.testing.assert_close(cache["blocks.0.mixer.hook_in"], read, rtol=0, atol=1e-12)
    torch.testing.assert_close(  # the mixer's write is added as it is
        cache["blocks.0.hook_attn_out"], cache["blocks.0.mixer.hook_out"], rtol=0, atol=0
    )
    with torch.no_grad():
        mlp_out = block.mlp(_rms(cache["blocks.0.hook_resid_mid"], block.ln2.w, eps))
    torch.testing.assert_close(cache["blocks.0.hook_mlp_out"], mlp_out, rtol=0, atol=1e-12)


def test_a_post_block_norms_what_its_sublayers_write():
    m = model()
    with torch.no_grad():
        _, cache = m.run_with_cache(TOKENS)
    block, eps = m.blocks[1], m.cfg.eps
    # The attention reads the stream itself: its values are the stream times W_V.
    v = torch.einsum("bpd,hde->bphe", cache["blocks.1.hook_resid_pre"], block.attn.W_V)
    torch.testing.assert_close(cache["blocks.1.attn.hook_v"], v + block.attn.b_V, rtol=0,
                               atol=1e-12)  # fmt: skip
    z = cache["blocks.1.attn.hook_z"]
    written = torch.einsum("bphe,hed->bpd", z, block.attn.W_O) + block.attn.b_O
    attn_out = _rms(written, block.ln1_post.w, eps)
    torch.testing.assert_close(cache["blocks.1.hook_attn_out"], attn_out, rtol=0, atol=1e-12)
    with torch.no_grad():
        mlp_out = _rms(block.mlp(cache["blocks.1.hook_resid_mid"]), block.ln2_post.w, eps)
    torch.testing.assert_close(cache["blocks.1.hook_mlp_out"], mlp_out, rtol=0, atol=1e-12)


def test_each_block_holds_the_norms_its_placement_asks_for():
    names = {n for n, _ in model().named_parameters() if ".ln" in n}
    assert names == {"blocks.0.ln1.w", "blocks.0.ln2.w", "blocks.1.ln1_post.w",
                     "blocks.1.ln2_post.w", "blocks.2.ln1.w", "blocks.2.ln2.w"}  # fmt: skip


def test_the_decomposition_sums_through_each_blocks_norms():
    from analysis import decompose_resid

    m = model()
    with torch.no_grad():
        _, cache = m.run_with_cache(TOKENS)
    for granularity in ("sublayer", "head"):
        decomposition = decompose_resid(m, cache, granularity=granularity)
        torch.testing.assert_close(
            decomposition.components.sum(0), cache["blocks.2.hook_resid_post"], rtol=0, atol=1e-10
        )


def test_the_config_round_trips_through_json():
    cfg = model().cfg
    again = HookedTransformerConfig.from_dict(json.loads(cfg.to_json()))
    assert again == cfg and again.placement_layers == PLACEMENTS


def test_folding_and_centring_are_refused_naming_the_post_blocks():
    m = model()
    with pytest.raises(ValueError, match=r"placement_layers 'post' in blocks \[1\]"):
        fold_layer_norm(m)
    centring = hybrid_cfg(KINDS).replace(normalization_type="LN", placement_layers=PLACEMENTS)
    with pytest.raises(ValueError, match=r"placement_layers 'post' in blocks \[1\]"):
        center_writing_weights(HookedTransformer(centring))


@pytest.mark.parametrize(
    "placements, match",
    [(("pre", "post"), "must be 3 placements"),
     (("pre", "post", "post_residual"), "each one of"),
     (("pre", "sideways", "pre"), "each one of")],
)  # fmt: skip
def test_a_wrong_placement_list_is_refused(placements, match):
    with pytest.raises(ValueError, match=match):
        hybrid_cfg(KINDS).replace(placement_layers=placements)


def test_placement_layers_beside_post_residual_norms_is_refused():
    cfg = hybrid_cfg(("attention", "attention")).replace(mixers=None)
    with pytest.raises(ValueError, match="not 'post_residual'"):
        cfg.replace(normalization_placement="post_residual", placement_layers=("pre", "post"))
