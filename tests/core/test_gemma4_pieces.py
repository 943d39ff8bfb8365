"""Gemma 4's pieces on a model of our own (float64, random gains): the per-layer input
sublayer against its equations written out, the block scalar's decomposition, the value
norm as the values the heads read, generation with the KV cache equal to the plain forward,
and each config field's validation naming the bad value."""

import pytest
import torch

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core.components.mlp import gelu_new
from hookedattn.testing.models import randomize_parameters

TOKENS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8]])
BASE = dict(n_layers=3, d_model=16, n_ctx=32, d_vocab=23, n_heads=4, d_head=8, d_mlp=24,
            n_key_value_heads=2, d_head_layers=(4, 4, 8), positional_embedding_type="rotary",
            rotary_base=1e6, rotary_pairs=2, rotary_base_local=1e4, rotary_dim_local=4,
            window_size=3, attn_types=("local", "local", "global"), normalization_type="RMS",
            normalization_placement="pre_and_post", gated_mlp=True, act_fn="gelu_new",
            use_qk_norm=True, use_v_norm=True, resid_post_scale=True, d_per_layer_input=6,
            dtype="float64", seed=0)  # fmt: skip


def model(**fields) -> HookedTransformer:
    # A copy with every weight random: the block scalars away from one.
    return randomize_parameters(HookedTransformer(HookedTransformerConfig(**BASE | fields)), seed=1)


def test_the_per_layer_write_is_its_equations_written_out():
    m = model()
    _, cache = m.run_with_cache(TOKENS)
    p = m.per_layer_inputs
    embedding = cache["hook_embed"]
    projected = torch.einsum("bpd,dle->bple", embedding, p.W_proj)
    rms = (projected.pow(2).mean(-1, keepdim=True) + m.cfg.eps).sqrt()
    per_layer = projected / rms * p.ln.w + p.W_E[TOKENS]
    torch.testing.assert_close(cache["per_layer_inputs.hook_per_layer_inputs"], per_layer)
    for layer, block in enumerate(m.blocks):
        s = block.per_layer_input
        fed = cache[f"blocks.{layer}.hook_resid_mid"] + cache[f"blocks.{layer}.hook_mlp_out"]
        mixed = gelu_new(fed @ s.W_gate) * per_layer[:, :, layer]
        out = mixed @ s.W_out
        out = out / (out.pow(2).mean(-1, keepdim=True) + m.cfg.eps).sqrt() * s.ln_post.w
        torch.testing.assert_close(cache[f"blocks.{layer}.hook_per_layer_out"], out)


def test_the_stream_a_block_leaves_is_its_scalar_times_its_writes():
    m = model()
    _, cache = m.run_with_cache(TOKENS)
    for layer, block in enumerate(m.blocks):
        writes = sum(cache[f"blocks.{layer}.{name}"]
                     for name in ("hook_resid_pre", "hook_attn_out", "hook_mlp_out",
                                  "hook_per_layer_out"))  # fmt: skip
        expected = block.resid_scale.w * writes
        torch.testing.assert_close(cache[f"blocks.{layer}.hook_resid_post"], expected)


def test_the_heads_read_each_value_head_rms_normed():
    m = model(d_per_layer_input=None)
    _, cache = m.run_with_cache(TOKENS)
    v = cache["blocks.2.attn.hook_v"]
    normed = v / (v.pow(2).mean(-1, keepdim=True) + m.cfg.eps).sqrt()
    torch.testing.assert_close(cache["blocks.2.attn.v_norm.hook_out"], normed)
    z = torch.einsum("bhqk,bkhd->bqhd", cache["blocks.2.attn.hook_pattern"],
                     normed.repeat_interleave(2, dim=2))  # fmt: skip
    torch.testing.assert_close(cache["blocks.2.attn.hook_z"], z)


def test_the_local_blocks_rotate_their_own_width():
    m = model()
    assert [block.attn.rotary.rotary_dim for block in m.blocks] == [4, 4, 8]
    assert m.blocks[0].attn.rotary.inv_freq.shape == (2,)


def test_generation_with_the_kv_cache_is_the_plain_forward():
    m = model()
    cached = m.generate(
        TOKENS[:, :3], max_new_tokens=6, do_sample=False, use_past_kv_cache=True, stop_at_eos=False
    )
    plain = m.generate(
        TOKENS[:, :3], max_new_tokens=6, do_sample=False, use_past_kv_cache=False, stop_at_eos=False
    )
    assert torch.equal(cached, plain)


VARIANTS = [{}, {"d_per_layer_input": None}, {"resid_post_scale": False}]
POINTS = [("resid_pre", 1), ("resid_mid", 1), ("resid_post", 1), ("resid_post", None)]


@pytest.mark.parametrize("fields", VARIANTS)
@pytest.mark.parametrize("granularity", ["sublayer", "head", "neuron"])
@pytest.mark.parametrize(("site", "layer"), POINTS)
def test_the_decomposition_sums_to_the_stream(fields, granularity, site, layer):
    from analysis import decompose_resid

    m = model(**fields)
    _, cache = m.run_with_cache(TOKENS)
    decomposition = decompose_resid(m, cache, layer, site, granularity)
    name = f"blocks.{2 if layer is None else layer}.hook_{site}"
    torch.testing.assert_close(decomposition.components.sum(0), cache[name], rtol=1e-12, atol=1e-12)


def test_the_embedding_reaches_the_final_stream_through_every_block_scalar():
    from analysis import decompose_resid

    m = model()
    _, cache = m.run_with_cache(TOKENS)
    decomposition = decompose_resid(m, cache, None, granularity="head")
    scalars = torch.stack([block.resid_scale.w for block in m.blocks]).prod()
    assert abs(scalars.item() - 1) > 0.05  # the scalars are not one
    embed = decomposition.components[decomposition.labels.index("embed")]
    torch.testing.assert_close(embed, cache["hook_embed"] * scalars, rtol=1e-12, atol=1e-12)
    per_layer = decomposition.components[decomposition.labels.index("L0_per_layer")]
    later = m.blocks[1].resid_scale.w * m.blocks[2].resid_scale.w  # block 0's own, and after
    expected = cache["blocks.0.hook_per_layer_out"] * m.blocks[0].resid_scale.w * later
    torch.testing.assert_close(per_layer, expected, rtol=1e-12, atol=1e-12)


def test_the_final_decomposition_through_the_final_norm_sums_to_its_output():
    from analysis import apply_ln_to_stack, decompose_resid

    m = model()
    _, cache = m.run_with_cache(TOKENS)
    normed = apply_ln_to_stack(m, cache, decompose_resid(m, cache, None, granularity="neuron"))
    torch.testing.assert_close(normed.sum(), cache["ln_final.hook_out"], rtol=1e-12, atol=1e-12)


def test_a_block_writes_its_per_layer_term_after_its_mlp():
    from analysis import decompose_resid

    m = model()
    _, cache = m.run_with_cache(TOKENS)
    labels = decompose_resid(m, cache, 1, "resid_post").labels
    assert labels == ("embed", "L0_attn", "L0_mlp", "L0_per_layer", "L1_attn", "L1_mlp",
                      "L1_per_layer")  # fmt: skip


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"rotary_base_local": None}, r"rotary_dim_local=4 .* needs .* rotary_base_local"),
        ({"rotary_dim_local": 5}, r"rotary_dim_local must be even and in 2..d_head=4 \(block 0\)"),
        ({"rotary_dim_local": 6}, r"rotary_dim_local must be even and in 2..d_head=4 \(block 0\)"),
        ({"parallel_attn_mlp": True}, r"resid_post_scale is built by the sequential block"),
        ({"kv_lora_rank": 8, "d_head_layers": None, "rotary_dim_local": None,
          "rotary_base_local": None, "attn_types": None, "window_size": None,
          "n_key_value_heads": None, "use_qk_norm": False, "rotary_dim": 4,
          "rotary_pairs": None},
         r"use_v_norm norms each value head .* \(kv_lora_rank=8\)"),
        ({"resid_post_scale": False, "normalization_placement": "post_residual"},
         r"d_per_layer_input is built by the sequential block"),
    ],
)  # fmt: skip
def test_a_bad_setting_is_named(fields, message):
    with pytest.raises(ValueError, match=message):
        HookedTransformerConfig(**BASE | fields)


@pytest.mark.parametrize("point", ["blocks.1.hook_resid_pre", "blocks.1.hook_resid_mid"])
def test_the_features_of_an_sae_reach_later_streams_through_the_block_scalars(point):
    from analysis import decompose_resid
    from hookedattn.sae import SAEConfig, SparseAutoencoder

    m = model()
    sae = SparseAutoencoder(SAEConfig(16, 40, point, dtype="float64", seed=2))
    with torch.no_grad():
        sae.b_enc.add_(0.1)
    with m.saes([sae]):
        _, cache = m.run_with_cache(TOKENS)
    for layer, site in ((1, "resid_post"), (2, "resid_mid"), (None, "resid_post")):
        decomposition = decompose_resid(m, cache, layer, site, "features", sae=sae)
        name = f"blocks.{2 if layer is None else layer}.hook_{site}"
        torch.testing.assert_close(decomposition.sum(), cache[name], rtol=1e-12, atol=1e-12)
    final = decompose_resid(m, cache, None, "resid_post", "features", sae=sae)
    b_dec = final.components[final.labels.index("sae_b_dec")]
    later = torch.stack([block.resid_scale.w for block in m.blocks[1:]]).prod()
    torch.testing.assert_close(b_dec, (sae.b_dec * later).expand_as(b_dec), rtol=1e-12, atol=1e-12)
