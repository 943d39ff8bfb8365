"""hookedattn_tl's ActivationCache: TransformerLens's methods, arguments and return conventions.

The inputs are TransformerLens idioms (from its documentation and test suite); the
references are built here from the cached activations and the weights, the way the
TransformerLens docs define each quantity.
"""

import pytest
import torch
from torch.testing import assert_close

import hookedattn
import hookedattn_tl as transformer_lens
from hookedattn.testing import random_tiny_model
from hookedattn_tl import HookedTransformer

N_LAYERS, N_HEADS, D_MLP = 2, 3, 20


def make_model(**overrides) -> HookedTransformer:
    fields = dict(
        n_layers=N_LAYERS, d_model=12, n_heads=N_HEADS, d_head=4, d_mlp=D_MLP, d_vocab=30,
        act_fn="gelu",
    )  # fmt: skip
    # Every parameter random: nonzero biases, gains away from one.
    return random_tiny_model(model_class=HookedTransformer, **{**fields, **overrides})


@pytest.fixture(scope="module")
def model() -> HookedTransformer:
    return make_model()


@pytest.fixture(scope="module")
def tokens() -> torch.Tensor:
    return torch.randint(0, 30, (3, 7), generator=torch.Generator().manual_seed(2))


@pytest.fixture(scope="module")
def cache(model, tokens):
    return model.run_with_cache(tokens)[1]


def centred_over_scale(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """TL's apply_ln_to_stack: the mean removed, divided by the cached scale."""
    return (x - x.mean(-1, keepdim=True)) / scale


def test_run_with_cache_returns_tl_cache_bound_to_the_model(model, cache):
    assert isinstance(cache, transformer_lens.ActivationCache)
    assert isinstance(cache, hookedattn.ActivationCache)
    assert cache.model is model
    _, plain = model.run_with_cache(torch.tensor([[1, 2, 3]]), return_cache_object=False)
    assert isinstance(plain, dict) and "blocks.0.attn.hook_pattern" in plain


@pytest.mark.parametrize(
    ("key", "name"),
    [
        ("k1", "blocks.1.attn.hook_k"),
        ("scale1ln2", "blocks.1.ln2.hook_scale"),
        (("z", 0, "attn"), "blocks.0.attn.hook_z"),
        (("post", 1, "mlp"), "blocks.1.mlp.hook_post"),
        (("pattern", -1), "blocks.1.attn.hook_pattern"),
        (("normalized", 0, "ln1"), "blocks.0.ln1.hook_normalized"),
        (("resid_pre", 1), "blocks.1.hook_resid_pre"),
        ("scale", "ln_final.hook_scale"),
    ],
)
def test_tl_keys_read_the_same_tensor_as_full_names(cache, key, name):
    assert cache[key] is cache[name]
    assert key in cache


def test_decompose_resid_sums_to_each_stream_with_tl_labels(cache):
    for layer in range(N_LAYERS + 1):
        parts, labels = cache.decompose_resid(layer=layer, return_labels=True)
        stream = cache["resid_pre", layer] if layer < N_LAYERS else cache["resid_post", -1]
        assert_close(parts.sum(0), stream)
        expected = ["embed", "pos_embed"]
        for block in range(layer):
            expected += [f"{block}_attn_out", f"{block}_mlp_out"]
        assert labels == expected
    parts, labels = cache.decompose_resid(layer=1, mlp_input=True, return_labels=True)
    assert labels[-1] == "1_attn_out"
    assert_close(parts.sum(0), cache["resid_mid", 1])


def test_decompose_resid_modes_and_embeds(cache):
    _, attn_labels = cache.decompose_resid(mode="attn", return_labels=True, incl_embeds=False)
    assert attn_labels == ["0_attn_out", "1_attn_out"]
    mlp, mlp_labels = cache.decompose_resid(mode="mlp", return_labels=True)
    assert mlp_labels == ["embed", "pos_embed", "0_mlp_out", "1_mlp_out"]
    assert_close(mlp[2], cache["mlp_out", 0])
    with pytest.raises(ValueError, match="mode"):
        cache.decompose_resid(mode="heads")


def test_decompose_resid_pos_slice_and_apply_ln(cache):
    parts = cache.decompose_resid(pos_slice=-1, apply_ln=True)
    whole = cache.decompose_resid()[:, :, -1]
    scale = cache["ln_final.hook_scale"][:, -1]
    assert_close(parts, centred_over_scale(whole, scale))


def test_accumulated_resid_stacks_the_streams(cache):
    stack, labels = cache.accumulated_resid(return_labels=True, incl_mid=True)
    assert labels == ["0_pre", "0_mid", "1_pre", "1_mid", "final_post"]
    names = ["resid_pre", "resid_mid", "resid_pre", "resid_mid", "resid_post"]
    expected = [cache[name, layer] for name, layer in zip(names, [0, 0, 1, 1, 1], strict=True)]
    assert_close(stack, torch.stack(expected))
    stack, labels = cache.accumulated_resid(layer=1, mlp_input=True, return_labels=True)
    assert labels == ["0_pre", "1_pre", "1_mid"]
    assert_close(stack[-1], cache["resid_mid", 1])


def test_accumulated_resid_apply_ln_at_the_end_is_the_logit_lens(model, cache):
    # TL 3.5: the final layer recomputes ln_final for each stream (its own scale, and w, b).
    lens = cache.accumulated_resid(apply_ln=True, pos_slice=-1)
    streams = cache.accumulated_resid(pos_slice=-1)
    ln = model.ln_final
    centred = streams - streams.mean(-1, keepdim=True)
    scale = (centred.pow(2).mean(-1, keepdim=True) + model.cfg.eps).sqrt()
    assert_close(lens, centred / scale * ln.w + ln.b)
    assert_close(lens[-1], cache["ln_final.hook_out"][:, -1])


def test_apply_ln_to_stack_leaves_out_gain_and_bias_as_tl_does(cache):
    parts = cache.decompose_resid(layer=1)
    scaled = cache.apply_ln_to_stack(parts, layer=1)
    assert_close(scaled, centred_over_scale(parts, cache["scale", 1, "ln1"]))
    mlp_in = cache.apply_ln_to_stack(parts, layer=1, mlp_input=True)
    assert_close(mlp_in, centred_over_scale(parts, cache["scale", 1, "ln2"]))
    one_prompt = cache.apply_ln_to_stack(parts[:, 1], layer=1, batch_slice=1, has_batch_dim=False)
    assert_close(one_prompt, centred_over_scale(parts[:, 1], cache["scale", 1, "ln1"][1]))


def test_folded_model_stack_through_ln_sums_to_hook_normalized(tokens):
    # TL's apply_ln_to_stack sums to hook_normalized (before the gain); with the gain
    # and bias folded away that is the norm's output too, which makes its direct logit
    # attribution add up.
    processed = hookedattn.process_weights(make_model())
    assert type(processed) is HookedTransformer
    _, cache = processed.run_with_cache(tokens)
    scaled = cache.apply_ln_to_stack(cache.decompose_resid(), layer=-1)
    assert_close(scaled.sum(0), cache["ln_final.hook_normalized"])
    assert_close(scaled.sum(0), cache["ln_final.hook_out"])


def test_logit_attrs_add_up_to_the_logit_difference_on_a_processed_model(tokens):
    model = hookedattn.process_weights(make_model())
    logits, cache = model.run_with_cache(tokens)
    right, wrong = tokens[:, -1], tokens[:, 0]
    parts = cache.decompose_resid(pos_slice=-1)
    attrs = cache.logit_attrs(parts, right, wrong, pos_slice=-1)
    assert attrs.shape == (len(parts), 3)
    rows = torch.arange(3)
    diff = logits[rows, -1, right] - logits[rows, -1, wrong]
    bias = model.b_U[right] - model.b_U[wrong]
    assert_close(attrs.sum(0) + bias, diff)


def test_logit_attrs_rejects_mismatched_token_shapes(cache):
    parts = cache.decompose_resid(pos_slice=-1)
    with pytest.raises(ValueError, match="same shape"):
        cache.logit_attrs(parts, torch.tensor([1, 2, 3]), torch.tensor([[1, 2, 3]]))


def test_stack_head_results_with_remainder_and_labels(model, cache):
    heads, labels = cache.stack_head_results(return_labels=True, incl_remainder=True)
    assert labels == [f"L{layer}H{h}" for layer in range(N_LAYERS) for h in range(N_HEADS)] + [
        "remainder"
    ]
    assert_close(heads.sum(0), cache["resid_post", -1])
    z, W_O = cache["z", 0], model.blocks[0].attn.W_O
    assert_close(heads[1], torch.einsum("bpd,dm->bpm", z[:, :, 1], W_O[1]))
    empty, none = cache.stack_head_results(layer=0, return_labels=True)
    assert empty.shape == (0, 3, 7, 12) and none == []
    scaled = cache.stack_head_results(layer=1, pos_slice=-1, apply_ln=True)
    raw = cache.stack_head_results(layer=1, pos_slice=-1)
    assert_close(scaled, centred_over_scale(raw, cache["scale", 1, "ln1"][:, -1]))


@pytest.mark.parametrize("negative", [-1, -2, -3])
def test_negative_layers_count_from_the_end_for_every_stack(cache, negative):
    # -1 is the final stream, -2 the last block's input, as decompose_resid reads them; TL
    # 3.5.1's stack_head_results reads -2 as range(-2) and returns an empty stack.
    position = N_LAYERS + 1 + negative
    heads, labels = cache.stack_head_results(layer=negative, return_labels=True)
    assert labels == [f"L{layer}H{h}" for layer in range(position) for h in range(N_HEADS)]
    assert_close(heads, cache.stack_head_results(layer=position))
    assert_close(cache.decompose_resid(layer=negative), cache.decompose_resid(layer=position))
    assert_close(cache.accumulated_resid(layer=negative), cache.accumulated_resid(layer=position))


def test_compute_head_results_adds_hook_result_in_place(model, tokens):
    _, cache = model.run_with_cache(tokens)
    assert "blocks.0.attn.hook_result" not in cache
    cache.compute_head_results()
    with_results = make_model()
    with_results.set_use_attn_result(True)
    _, reference = with_results.run_with_cache(tokens)
    assert_close(cache["result", 1], reference["result", 1])


def test_head_results_are_added_after_every_activation_each_the_per_head_product(model, tokens):
    _, cache = model.run_with_cache(tokens)
    names_before = list(cache)
    cache.compute_head_results()
    added = [f"blocks.{layer}.attn.hook_result" for layer in range(N_LAYERS)]
    assert list(cache) == names_before + added  # TL's order: appended, layer by layer
    for layer in range(N_LAYERS):
        z, W_O = cache["z", layer], model.blocks[layer].attn.W_O
        for h in range(N_HEADS):
            expected = torch.einsum("bpd,dm->bpm", z[:, :, h], W_O[h])
            assert_close(cache["result", layer][:, :, h], expected)
    heads = cache.stack_head_results()
    for layer in range(N_LAYERS):
        assert torch.equal(heads[layer * N_HEADS : (layer + 1) * N_HEADS],
                           cache["result", layer].permute(2, 0, 1, 3))  # fmt: skip


def test_the_head_stack_is_a_tensor_of_its_own(model, tokens):
    # As in TL, where it is a new tensor: editing it leaves the cache and later stacks as
    # they were (and the cache does not count as edited).
    _, cache = model.run_with_cache(tokens)
    heads = cache.stack_head_results()
    before = heads.clone()
    heads.mul_(0)
    last = cache.stack_head_results(pos_slice=-1)
    last[0] += 1
    assert torch.equal(cache.stack_head_results(), before)
    assert torch.equal(cache["result", 0].permute(2, 0, 1, 3), before[:N_HEADS])
    assert torch.equal(cache.stack_head_results(pos_slice=-1), before[:, :, -1])


def test_the_head_stack_is_the_same_from_recorded_results(model, tokens):
    # Results recorded by the forward (use_attn_result) are stacked from the cache's entries.
    _, computed = model.run_with_cache(tokens)
    with_results = make_model()
    with_results.set_use_attn_result(True)
    _, recorded = with_results.run_with_cache(tokens)
    for layer in (1, 2):
        assert_close(
            recorded.stack_head_results(layer, pos_slice=(1, 4)),
            computed.stack_head_results(layer, pos_slice=(1, 4)),
        )


def test_head_results_without_a_batch_axis_cover_every_position(model):
    tokens = torch.tensor([[3, 1, 4, 1, 5]])
    _, batched = model.run_with_cache(tokens)
    _, single = model.run_with_cache(tokens)
    single.remove_batch_dim()
    assert_close(single.stack_head_results(), batched.stack_head_results()[:, 0])
    assert single["result", 1].shape == (5, N_HEADS, 12)
    assert_close(single.stack_head_results(pos_slice=-1), batched.stack_head_results()[:, 0, -1])


def test_stack_neuron_results_slices_and_remainder(model, cache):
    neurons, labels = cache.stack_neuron_results(2, return_labels=True, incl_remainder=True)
    assert len(labels) == N_LAYERS * D_MLP + 1 and labels[:2] == ["L0N0", "L0N1"]
    assert_close(neurons.sum(0), cache["resid_post", 1])
    picked, labels = cache.stack_neuron_results(1, neuron_slice=(0, 3), return_labels=True)
    assert labels == ["L0N0", "L0N1", "L0N2"]
    W_out = model.blocks[0].mlp.W_out
    assert_close(picked[2], cache["post", 0][..., 2, None] * W_out[2])
    direction = torch.randn(12, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    projected = cache.stack_neuron_results(2, project_output_onto=direction)
    assert_close(projected, cache.stack_neuron_results(2) @ direction)


def test_get_neuron_results_matches_post_times_w_out(model, cache):
    result = cache.get_neuron_results(1, neuron_slice=[4, 7], pos_slice=(2, 5))
    expected = cache["post", 1][:, 2:5, [4, 7], None] * model.blocks[1].mlp.W_out[[4, 7]]
    assert_close(result, expected)


@pytest.mark.parametrize("expand_neurons", [True, False])
def test_full_resid_decomposition_sums_to_the_stream(cache, expand_neurons):
    full, labels = cache.get_full_resid_decomposition(
        expand_neurons=expand_neurons, return_labels=True
    )
    assert labels[:N_HEADS] == ["L0H0", "L0H1", "L0H2"]
    assert labels[-3:] == ["embed", "pos_embed", "bias"]
    assert len(labels) == len(full)
    assert_close(full.sum(0), cache["resid_post", -1])
    mid = cache.get_full_resid_decomposition(layer=1, mlp_input=True, expand_neurons=expand_neurons)
    assert_close(mid.sum(0), cache["resid_mid", 1])


def test_stack_activation_is_one_name_across_layers(cache):
    stacked = cache.stack_activation("scale", sublayer_type="ln2")
    assert_close(stacked, torch.stack([cache["scale", layer, "ln2"] for layer in range(N_LAYERS)]))
    assert cache.stack_activation("pattern", layer=1).shape == (1, 3, N_HEADS, 7, 7)


def test_remove_batch_dim_in_place_and_methods_without_batch(model):
    _, cache = model.run_with_cache(torch.tensor([[3, 1, 4, 1, 5]]))
    assert cache.remove_batch_dim() is cache
    assert not cache.has_batch_dim and cache["resid_pre", 0].shape == (5, 12)
    parts = cache.decompose_resid()
    assert parts.shape == (6, 5, 12)
    assert_close(parts.sum(0), cache["resid_post", -1])
    assert cache.stack_head_results(pos_slice=-1, apply_ln=True).shape == (6, 12)
    assert cache.accumulated_resid(apply_ln=True).shape == (3, 5, 12)
    _, batch = model.run_with_cache(torch.tensor([[1, 2], [3, 4]]))
    with pytest.raises(ValueError, match="batch of 1"):
        batch.remove_batch_dim()


def test_run_with_cache_remove_batch_dim(model):
    _, cache = model.run_with_cache(torch.tensor([[3, 1, 4]]), remove_batch_dim=True)
    assert not cache.has_batch_dim
    assert cache.decompose_resid(layer=1).shape == (4, 3, 12)


def test_apply_slice_to_batch_dim(cache):
    one = cache.apply_slice_to_batch_dim(1)
    assert not one.has_batch_dim and one.model is cache.model
    assert_close(one["resid_pre", 1], cache["resid_pre", 1][1])
    assert_close(one.tokens, cache.tokens[1])
    two = cache.apply_slice_to_batch_dim((0, 2))
    assert two.has_batch_dim and two["pattern", 0].shape[0] == 2


def test_toggle_autodiff_sets_the_global_mode(cache):
    try:
        cache.toggle_autodiff(False)
        assert not torch.is_grad_enabled()
    finally:
        cache.toggle_autodiff(True)
    assert torch.is_grad_enabled()
