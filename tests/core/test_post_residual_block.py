"""Post-residual norms (`normalization_placement="post_residual"`, the original
Transformer's, GPT-1's, BERT's): the block against a brute-force reference written here,
its hook points, and the analysis that assumes a sum refusing it by name."""

import pytest
import torch

from hookedattn import HookedTransformer, HookedTransformerConfig

TOKENS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6], [5, 3, 5, 8, 9, 7, 9, 3]])


def post_residual_model(**changes) -> HookedTransformer:
    cfg = dict(n_layers=2, d_model=16, n_ctx=12, d_vocab=11, n_heads=4, d_mlp=24,
               act_fn="gelu_new", normalization_placement="post_residual", seed=0,
               dtype=torch.float64, use_fused_kernels=False)  # fmt: skip
    model = HookedTransformer(HookedTransformerConfig(**(cfg | changes)))
    with torch.no_grad():  # gains and biases away from 1 and 0, so a misplaced norm shows
        for name, param in model.named_parameters():
            if name.endswith((".w", ".b", "b_in", "b_out", "b_O", "b_Q", "b_U")):
                param.add_(0.3 * torch.randn(param.shape, dtype=param.dtype))
    return model


def layer_norm(x, w, b, eps):
    x = x - x.mean(-1, keepdim=True)
    return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) + b


def brute_force_logits(model: HookedTransformer, tokens):
    """The post-residual transformer written out, one head and one position at a time."""
    cfg, gelu = model.cfg, torch.nn.functional.gelu
    n_pos = tokens.shape[1]
    x = model.embed.W_E[tokens] + model.pos_embed.W_pos[:n_pos]
    for block in model.blocks:
        a = block.attn
        attn_out = torch.zeros_like(x) + a.b_O
        for h in range(cfg.n_heads):
            q = x @ a.W_Q[h] + a.b_Q[h]
            k = x @ a.W_K[h] + a.b_K[h]
            v = x @ a.W_V[h] + a.b_V[h]
            for i in range(n_pos):
                scores = (q[:, i : i + 1] @ k[:, : i + 1].transpose(1, 2)) / cfg.attn_scale
                z = torch.softmax(scores, -1) @ v[:, : i + 1]
                attn_out[:, i] += (z @ a.W_O[h])[:, 0]
        mid_norm, post_norm = block.ln_resid_mid, block.ln_resid_post
        x = layer_norm(x + attn_out, mid_norm.w, mid_norm.b, cfg.eps)
        m = block.mlp
        hidden = gelu(x @ m.W_in + m.b_in, approximate="tanh")
        x = layer_norm(x + hidden @ m.W_out + m.b_out, post_norm.w, post_norm.b, cfg.eps)
    return x @ model.unembed.W_U + model.unembed.b_U


def test_the_block_computes_the_post_residual_equations():
    model = post_residual_model()
    with torch.no_grad():
        got, want = model(TOKENS), brute_force_logits(model, TOKENS)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_the_fused_kernels_compute_the_same_numbers():
    model = post_residual_model()
    fused = post_residual_model(use_fused_kernels=True)
    fused.load_state_dict(model.state_dict())
    with torch.no_grad():
        torch.testing.assert_close(fused(TOKENS), model(TOKENS), rtol=0, atol=1e-10)


def test_the_hook_points_hold_the_normed_streams_and_the_writes():
    model = post_residual_model()
    _, cache = model.run_with_cache(TOKENS)
    block = model.blocks[0]
    summed = cache["blocks.0.hook_resid_pre"] + cache["blocks.0.hook_attn_out"]
    torch.testing.assert_close(cache["blocks.0.hook_resid_mid"], block.ln_resid_mid(summed))
    summed = cache["blocks.0.hook_resid_mid"] + cache["blocks.0.hook_mlp_out"]
    torch.testing.assert_close(cache["blocks.0.hook_resid_post"], block.ln_resid_post(summed))
    # The norms record their divisors as every norm does, by the names' shorthand.
    assert cache["scale", 1, "ln_resid_post"].shape == (2, 8, 1)
    assert "ln_final.hook_scale" not in cache  # the last block's norm is the final one


@pytest.mark.parametrize("changes", [dict(attn_only=True), dict(parallel_attn_mlp=True)])
def test_the_placement_needs_a_sequential_block(changes):
    with pytest.raises(ValueError, match="post_residual.*sequential"):
        post_residual_model(**changes)


@pytest.mark.parametrize("site", ["resid_pre", "resid_mid", "resid_post"])
@pytest.mark.parametrize("layer", [0, 1])
def test_the_decomposition_through_frozen_norms_sums_to_the_stream(site, layer):
    from analysis import decompose_resid

    model = post_residual_model()
    _, cache = model.run_with_cache(TOKENS)
    decomposition = decompose_resid(model, cache, layer=layer, site=site)
    want = cache[f"blocks.{layer}.hook_{site}"]
    torch.testing.assert_close(decomposition.components.sum(0), want, rtol=0, atol=1e-10)


def test_the_decomposition_labels_each_norms_bias_and_passes_each_write_through_later_norms():
    from analysis import decompose_resid

    model = post_residual_model()
    _, cache = model.run_with_cache(TOKENS)
    decomposition = decompose_resid(model, cache, layer=0, site="resid_post")
    assert decomposition.labels == ("embed", "pos_embed", "L0_attn", "L0_ln_resid_mid_bias",
                                    "L0_mlp", "L0_ln_resid_post_bias")  # fmt: skip
    # The MLP's write passed the last norm only: centred, divided by its scale, times w.
    norm = model.blocks[0].ln_resid_post
    mlp_out = cache["blocks.0.hook_mlp_out"]
    want = norm.w * (mlp_out - mlp_out.mean(-1, keepdim=True)) / cache["scale", 0, "ln_resid_post"]
    torch.testing.assert_close(decomposition["L0_mlp"], want, rtol=0, atol=1e-12)


def test_direct_logit_attribution_through_frozen_norms_sums_to_the_logits():
    from analysis import decompose_resid, direct_logit_attribution

    model = post_residual_model()
    logits, cache = model.run_with_cache(TOKENS)
    attribution = direct_logit_attribution(model, cache, decompose_resid(model, cache), tokens=4)
    assert "b_U" in attribution.labels
    torch.testing.assert_close(attribution.total(), logits[..., 4], rtol=0, atol=1e-10)


def test_finer_granularities_refuse_where_norms_rescale_the_stream():
    from analysis import decompose_resid

    model = post_residual_model()
    _, cache = model.run_with_cache(TOKENS)
    with pytest.raises(ValueError, match="only granularity='sublayer'"):
        decompose_resid(model, cache, granularity="head")


@pytest.mark.parametrize("step", ["fold_layer_norm", "center_writing_weights"])
def test_weight_processing_refuses_post_residual_norms(step):
    import hookedattn

    with pytest.raises(ValueError, match="post_residual"):
        getattr(hookedattn, step)(post_residual_model())


def bert_like_model(**changes) -> HookedTransformer:
    """Post-residual norms, an embedding norm and a head transform, as BERT's."""
    return post_residual_model(**(dict(embed_norm=True, unembed_transform="gelu") | changes))


def test_the_embedding_norm_and_the_head_transform_are_the_equations():
    model = bert_like_model()
    _, cache = model.run_with_cache(TOKENS)
    summed = cache["hook_embed"] + cache["hook_pos_embed"]
    ln_embed = model.ln_embed
    want = layer_norm(summed, ln_embed.w, ln_embed.b, model.cfg.eps)
    torch.testing.assert_close(cache["blocks.0.hook_resid_pre"], want, rtol=0, atol=1e-12)
    head, final = model.unembed_transform, cache["blocks.1.hook_resid_post"]
    hidden = torch.nn.functional.gelu(final @ head.W_dense + head.b_dense)
    normed = layer_norm(hidden, head.ln_unembed.w, head.ln_unembed.b, model.cfg.eps)
    want = normed @ model.unembed.W_U + model.unembed.b_U
    torch.testing.assert_close(model(TOKENS), want, rtol=0, atol=1e-10)


def test_an_embedding_norm_decomposes_through_its_frozen_scale():
    from analysis import decompose_resid

    model = bert_like_model(normalization_placement="pre", unembed_transform=None)
    _, cache = model.run_with_cache(TOKENS)
    for layer in (0, 1):
        decomposition = decompose_resid(model, cache, layer=layer, check=True)
        assert decomposition.labels[:3] == ("embed", "pos_embed", "ln_embed_bias")


def test_a_head_transform_refuses_direct_logit_attribution_and_folding():
    from analysis import decompose_resid, direct_logit_attribution

    plain = post_residual_model(normalization_placement="pre", unembed_transform="gelu")
    _, cache = plain.run_with_cache(TOKENS)
    with pytest.raises(ValueError, match="no linear function"):
        direct_logit_attribution(plain, cache, decompose_resid(plain, cache), tokens=1)
    import hookedattn

    with pytest.raises(ValueError, match="unembed_transform"):
        hookedattn.fold_layer_norm(plain)


def test_a_saved_bert_like_model_loads_as_it_was(tmp_path):
    model = bert_like_model()
    loaded = HookedTransformer.load(model.save(tmp_path / "bert-like"))
    assert loaded.cfg == model.cfg
    with torch.no_grad():
        torch.testing.assert_close(loaded(TOKENS), model(TOKENS), rtol=0, atol=0)


def test_the_residual_identity_check_refuses_a_normed_stream_by_name():
    from hookedattn.testing import assert_residual_identities

    model = post_residual_model()
    _, cache = model.run_with_cache(TOKENS)
    with pytest.raises(ValueError, match="do not hold where norms rescale the stream"):
        assert_residual_identities(model, cache)


@pytest.mark.parametrize("placement", ["post_residual", "pre"])
def test_the_logit_lens_ends_at_the_models_logits_through_a_head_transform(placement):
    from analysis.logit_lens import logit_lens

    model = bert_like_model(normalization_placement=placement)
    logits, cache = model.run_with_cache(TOKENS)
    torch.testing.assert_close(logit_lens(model, cache)["final"], logits, rtol=0, atol=1e-10)


def test_a_bert_like_model_loads_over_a_device_map(tmp_path):
    model = bert_like_model()
    model.save(tmp_path / "bert-like")
    mapped = HookedTransformer.load(tmp_path / "bert-like", device_map=["cpu", "cpu"])
    assert {"ln_embed", "unembed_transform"} <= set(mapped.device_map)
    with torch.no_grad():
        torch.testing.assert_close(mapped(TOKENS), model(TOKENS), rtol=0, atol=0)
    kwargs = dict(max_new_tokens=4, stop_at_eos=False)
    assert torch.equal(mapped.generate(TOKENS, **kwargs), model.generate(TOKENS, **kwargs))
