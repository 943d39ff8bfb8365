"""Embeddings of another width than the stream (`d_embed`, projected by `embed_proj`) and a
head transform to another width (`d_unembed`): ELECTRA's and RemBERT's shape, on tiny
float64 models. Each checked against the same steps written out with `F.layer_norm` and
dense products; the residual decomposition summing to every cached stream; a save and load
round trip; generation reading the head; and the refusals of what has no meaning here."""

import pytest
import torch
import torch.nn.functional as F

from analysis import decompose_resid, full_ov_circuit, full_qk_circuit, logit_lens
from hookedattn import HookedTransformer, HookedTransformerConfig, center_writing_weights

TOKENS = torch.tensor([[3, 1, 4, 1, 5, 9, 2], [6, 5, 3, 5, 8, 9, 7]])


def config(**changes) -> HookedTransformerConfig:
    """ELECTRA's shape: post-residual LayerNorms, embeddings 8 wide normed then projected to
    the 16-wide stream, a GELU head transform to 6 wide before `W_U`."""
    fields = dict(n_layers=2, d_model=16, n_ctx=12, d_head=4, d_vocab=20, d_mlp=32,
                  act_fn="gelu", normalization_type="LN",
                  normalization_placement="post_residual", embed_norm=True, d_embed=8,
                  unembed_transform="gelu", d_unembed=6, dtype=torch.float64, seed=0)  # fmt: skip
    return HookedTransformerConfig(**(fields | changes))


def model_of(**changes) -> HookedTransformer:
    """A model of `config(**changes)` whose biases and norm parameters are random too (the
    initialisation leaves them zeros and ones)."""
    model = HookedTransformer(config(**changes))
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if not name.rsplit(".", 1)[-1].startswith("W_"):
                param.add_(0.1 * torch.randn(param.shape, generator=generator, dtype=param.dtype))
    return model


def test_the_projected_embeddings_enter_the_first_block():
    model = model_of()
    _, cache = model.run_with_cache(TOKENS)
    summed = model.W_E[TOKENS] + model.W_pos[: TOKENS.shape[1]]
    normed = F.layer_norm(summed, (8,), model.ln_embed.w, model.ln_embed.b, eps=model.cfg.eps)
    expected = normed @ model.embed_proj.W_proj + model.embed_proj.b_proj
    assert cache["hook_embed"].shape == (2, 7, 8)  # the narrow vectors, as they were
    torch.testing.assert_close(cache["blocks.0.hook_resid_pre"], expected, rtol=0, atol=1e-12)


def test_without_a_norm_the_projection_reads_the_rotated_models_embedding():
    model = model_of(normalization_placement="pre", embed_norm=False,
                     positional_embedding_type="rotary")  # fmt: skip
    _, cache = model.run_with_cache(TOKENS)
    expected = model.W_E[TOKENS] @ model.embed_proj.W_proj + model.embed_proj.b_proj
    torch.testing.assert_close(cache["blocks.0.hook_resid_pre"], expected, rtol=0, atol=1e-12)


def test_the_head_transform_maps_the_stream_to_the_unembedding_width():
    model = model_of()
    logits, cache = model.run_with_cache(TOKENS)
    head = model.unembed_transform
    final = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
    dense = F.gelu(final @ head.W_dense + head.b_dense)
    normed = F.layer_norm(dense, (6,), head.ln_unembed.w, head.ln_unembed.b, eps=model.cfg.eps)
    expected = normed @ model.W_U + model.b_U
    assert model.W_U.shape == (6, 20)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-12)


def test_the_logit_lens_reads_each_stream_through_the_narrowing_head():
    model = model_of()
    logits, cache = model.run_with_cache(TOKENS)
    lens = logit_lens(model, cache)
    torch.testing.assert_close(lens.logits[-1], logits, rtol=0, atol=1e-12)


@pytest.mark.parametrize("site", ["resid_pre", "resid_mid", "resid_post"])
def test_the_decomposition_sums_to_every_stream(site):
    model = model_of()
    _, cache = model.run_with_cache(TOKENS)
    for layer in range(model.cfg.n_layers):
        parts = decompose_resid(model, cache, layer=layer, site=site)
        assert parts.labels[:4] == ("embed", "pos_embed", "ln_embed_bias", "embed_proj_bias")
        total = parts.components.sum(0)
        expected = cache[f"blocks.{layer}.hook_{site}"]
        torch.testing.assert_close(total, expected, rtol=0, atol=1e-12)


def test_the_embedding_terms_are_the_normed_embeddings_through_the_projection():
    model = model_of()
    _, cache = model.run_with_cache(TOKENS)
    parts = decompose_resid(model, cache, layer=0)
    # The token's term: its share of the norm's input at the recorded scale, then W_proj.
    embed = cache["hook_embed"]
    centred = embed - embed.mean(-1, keepdim=True)
    share = centred / cache["ln_embed.hook_scale"] * model.ln_embed.w
    torch.testing.assert_close(parts.components[0], share @ model.embed_proj.W_proj,
                               rtol=0, atol=1e-12)  # fmt: skip
    bias = model.embed_proj.b_proj.expand(2, 7, 16)
    torch.testing.assert_close(parts.components[3], bias, rtol=0, atol=0)


def test_a_save_and_load_round_trip_keeps_the_widths_and_the_weights(tmp_path):
    model = model_of()
    model.save(tmp_path / "m")
    loaded = HookedTransformer.load(tmp_path / "m")
    assert (loaded.cfg.d_embed, loaded.cfg.d_unembed) == (8, 6)
    for name, param in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], param), name
    with torch.no_grad():
        torch.testing.assert_close(loaded(TOKENS), model(TOKENS), rtol=0, atol=1e-12)


@pytest.mark.parametrize("d_unembed", [6, None])  # None: BERT's square head transform
def test_greedy_generation_reads_the_head_transform(d_unembed):
    model = model_of(d_unembed=d_unembed)
    tokens = TOKENS[:, :3]
    for _ in range(4):  # the argmax of full forwards, token by token
        with torch.no_grad():
            chosen = model(tokens)[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, chosen], dim=1)
    got = model.generate(TOKENS[:, :3], max_new_tokens=4, do_sample=False, stop_at_eos=False)
    assert torch.equal(got, tokens)


def test_centring_the_writing_weights_centres_the_projection_and_keeps_the_logits():
    model = model_of(normalization_placement="pre", embed_norm=False)
    centred = center_writing_weights(model)
    with torch.no_grad():
        expected, (got, cache) = model(TOKENS), centred.run_with_cache(TOKENS)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    mean = cache["blocks.0.hook_resid_pre"].mean(-1)
    torch.testing.assert_close(mean, torch.zeros_like(mean), rtol=0, atol=1e-12)


@pytest.mark.parametrize("circuit", [full_qk_circuit, full_ov_circuit])
def test_circuits_of_the_stream_refuse_narrow_embeddings(circuit):
    with pytest.raises(ValueError, match="d_embed=8 wide"):
        circuit(model_of(), 0, 0)


def test_the_unembedding_width_needs_a_head_transform():
    with pytest.raises(ValueError, match="d_unembed=6 .* unembed_transform is None"):
        config(unembed_transform=None)


def test_narrow_embeddings_refuse_shortformer_positions():
    with pytest.raises(ValueError, match="d_embed=8 .*positional_embedding_type='shortformer'"):
        config(positional_embedding_type="shortformer", normalization_placement="pre")


def test_a_device_map_places_the_projection_with_the_embeddings():
    from hookedattn.core import parallel

    model = model_of(n_layers=4)
    mapped = parallel.place(model.copy(), ["cpu", "cpu"])
    assert list(mapped.device_map)[:4] == ["embed", "pos_embed", "ln_embed", "embed_proj"]
    with torch.no_grad():
        torch.testing.assert_close(mapped(TOKENS), model(TOKENS), rtol=0, atol=0)
