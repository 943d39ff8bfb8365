"""Every identity of the residual stream holds in the cache, across configurations.

Where the forward computes a quantity by exactly the operation the identity states, the
test demands bit equality; where the identity regroups a sum (heads' separate writes
against one fused product), it demands the dtype's tolerance.
"""

import pytest
import torch
from einops import einsum

from hookedattn.core.tolerances import tolerance
from hookedattn.testing import random_tiny_model, random_tokens

VARIANTS = {
    "default": {},
    "attn_only": {"attn_only": True},
    "rms_rotary": {"normalization_type": "RMS", "positional_embedding_type": "rotary"},
    "no_norm": {"normalization_type": None},
    "attn_result": {"use_attn_result": True},
    "split_inputs": {"use_split_qkv_input": True, "use_hook_mlp_in": True},
}


def run(dtype, **overrides):
    fields = dict(n_layers=3, d_model=24, n_heads=3, d_vocab=30, d_mlp=40, dtype=dtype)
    model = random_tiny_model(**{**fields, **overrides})
    tokens = random_tokens(30, batch=2, pos=9)
    return model, model.run_with_cache(tokens)[1]


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sublayers_add_to_the_stream(variant, dtype):
    model, cache = run(dtype, **VARIANTS[variant])
    for layer in range(model.cfg.n_layers):
        after_attn = cache["resid_pre", layer] + cache["attn_out", layer]
        if model.cfg.attn_only:
            assert torch.equal(cache["resid_post", layer], after_attn)
        else:
            assert torch.equal(cache["resid_mid", layer], after_attn)
            after_mlp = cache["resid_mid", layer] + cache["mlp_out", layer]
            assert torch.equal(cache["resid_post", layer], after_mlp)


@pytest.mark.parametrize("variant", VARIANTS)
def test_each_block_reads_what_the_last_one_wrote(variant):
    model, cache = run(torch.float64, **VARIANTS[variant])
    for layer in range(1, model.cfg.n_layers):
        # The same tensor (one storage), not merely equal values.
        assert cache["resid_pre", layer].data_ptr() == cache["resid_post", layer - 1].data_ptr()
        assert torch.equal(cache["resid_pre", layer], cache["resid_post", layer - 1])
    embedded = cache["hook_embed"]
    if "hook_pos_embed" in cache:
        embedded = embedded + cache["hook_pos_embed"]
    assert torch.equal(cache["resid_pre", 0], embedded)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_heads_results_plus_bias_are_the_attention_output(dtype):
    model, cache = run(dtype, use_attn_result=True)
    for layer in range(model.cfg.n_layers):
        summed = cache["result", layer].sum(dim=2) + model.blocks[layer].attn.b_O
        assert torch.equal(summed, cache["attn_out", layer])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sum_over_heads_of_z_times_w_o_is_the_attention_output(dtype):
    model, cache = run(dtype)
    for layer in range(model.cfg.n_layers):
        per_head = einsum(
            cache["z", layer],
            model.W_O[layer],
            "batch pos head d_head, head d_head d_model -> batch pos head d_model",
        )
        expected = per_head.sum(dim=2) + model.b_O[layer]
        torch.testing.assert_close(
            expected, cache["attn_out", layer], **tolerance(dtype).as_kwargs()
        )


def test_pattern_rows_are_distributions_over_earlier_positions():
    model, cache = run(torch.float64)
    for layer in range(model.cfg.n_layers):
        pattern = cache["pattern", layer]
        torch.testing.assert_close(pattern.sum(-1), torch.ones_like(pattern.sum(-1)))
        assert (pattern.triu(1) == 0).all()
