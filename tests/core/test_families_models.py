"""The tiny models of each family's block shape (`tests/helpers/families.py`): each has the
shape it claims."""

import pytest
import torch
from helpers.families import FAMILIES, family_run


@pytest.mark.parametrize("name", FAMILIES)
def test_each_family_has_the_shape_it_claims(name):
    model, _, cache = family_run(name)
    cfg, block = model.cfg, model.blocks[0]
    assert ("blocks.0.hook_resid_mid" in cache) == (not cfg.parallel_attn_mlp)
    assert ("blocks.0.ln1_post.hook_scale" in cache) == (cfg.normalization_placement != "pre")
    assert ("blocks.0.ln1.hook_scale" in cache) == (cfg.normalization_placement != "post")
    assert ("blocks.0.attn.q_norm.hook_scale" in cache) == cfg.use_qk_norm
    assert ("blocks.0.mlp.hook_pre_linear" in cache) == cfg.gated_mlp
    assert cache["k", 0].shape[2] == cfg.n_kv_heads
    assert model.W_K.shape == (cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head)
    if cfg.n_kv_heads != cfg.n_heads:
        assert block.attn._W_K.shape == (cfg.n_kv_heads, cfg.d_model, cfg.d_head)


def test_gemma2s_local_layer_blocks_keys_outside_its_window():
    _, _, cache = family_run("gemma2")
    local, full = cache["pattern", 0], cache["pattern", 1]
    assert torch.equal(local[..., 8, :6], torch.zeros_like(local[..., 8, :6]))
    assert bool((full[..., 8, :6] > 0).all())
