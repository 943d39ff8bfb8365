"""TransformerLens's cache methods on hybrid models (a mixer in attention's place, beside it,
or a block of one sublayer): the heads are the blocks with heads, each mixer's write is
one term labelled by its kind, and every decomposition sums to the cached stream, in
float64, against the stream and loops over the weights."""

import functools

import pytest
import torch
from torch.testing import assert_close

import hookedattn_tl as transformer_lens
from tests.helpers.mixers import beside_attention_cfg, hybrid_cfg, one_sublayer_cfg, randomised

TOKENS = torch.randint(0, 23, (2, 6), generator=torch.Generator().manual_seed(5))
LAYOUTS = {
    "in attention's place": lambda: hybrid_cfg(("mamba2", "attention", "short_conv", "attention")),
    "beside the attention": beside_attention_cfg,
    "one sublayer per block": one_sublayer_cfg,
}


@functools.cache
def _run(layout: str):
    model = transformer_lens.HookedTransformer(LAYOUTS[layout]())
    for block in model.blocks:
        randomised(block, 6)  # every bias and gain drawn too
    _, cache = model.run_with_cache(TOKENS)
    return model, cache


def _stream(cache, n_layers: int, layer: int, mlp_input: bool) -> torch.Tensor:
    """The cached stream that block `layer`'s attention (its MLP: `mlp_input`) reads (an
    MLP alone in its block reads `resid_pre`)."""
    if layer == n_layers:
        return cache[f"blocks.{layer - 1}.hook_resid_post"]
    mid = f"blocks.{layer}.hook_resid_mid"
    return cache[mid] if mlp_input and mid in cache else cache[f"blocks.{layer}.hook_resid_pre"]


@pytest.mark.parametrize("expand_neurons", [True, False])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_the_full_decomposition_sums_to_every_stream(layout, expand_neurons):
    model, cache = _run(layout)
    n_layers = model.cfg.n_layers
    for layer in range(n_layers + 1):
        with_mlp = layer < n_layers and model.cfg.layer_has_mlp(layer)
        for mlp_input in (False, True) if with_mlp else (False,):
            components, labels = cache.get_full_resid_decomposition(
                layer, mlp_input=mlp_input, expand_neurons=expand_neurons, return_labels=True
            )
            assert len(labels) == len(components) == len(set(labels))
            expected = _stream(cache, n_layers, layer, mlp_input)
            assert_close(components.sum(0), expected, rtol=0, atol=1e-10)


def test_the_full_decomposition_holds_each_mixers_write_labelled_by_its_kind():
    _, cache = _run("in attention's place")
    components, labels = cache.get_full_resid_decomposition(return_labels=True)
    assert labels[:8] == [f"L{b}H{h}" for b in (1, 3) for h in range(3)] + [
        "L0_mamba2",
        "L2_short_conv",
    ]
    assert_close(components[6], cache["blocks.0.hook_attn_out"], rtol=0, atol=0)
    assert_close(components[7], cache["blocks.2.hook_attn_out"], rtol=0, atol=0)
    _, beside = _run("beside the attention")
    _, labels = beside.get_full_resid_decomposition(1, mlp_input=True, return_labels=True)
    assert [label for label in labels if "mamba2" in label] == ["L0_mamba2", "L1_mamba2"]


def test_stack_head_results_are_each_head_z_times_W_O_in_the_blocks_with_heads():
    model, cache = _run("in attention's place")
    stack, labels = cache.stack_head_results(return_labels=True)
    assert labels == [f"L{b}H{h}" for b in (1, 3) for h in range(3)]
    for i, label in enumerate(labels):
        layer, head = int(label[1]), int(label[3])
        expected = cache["z", layer][:, :, head] @ model.blocks[layer].attn.W_O[head]
        assert_close(stack[i], expected, rtol=0, atol=1e-12)
    assert cache.stack_head_results(1).shape[0] == 0  # block 0 is a mixer


@pytest.mark.parametrize("layout", LAYOUTS)
def test_accumulated_bias_sums_the_attention_and_mlp_biases_there_are(layout):
    model, _ = _run(layout)
    parameters = dict(model.named_parameters())
    for layer in range(model.cfg.n_layers + 1):
        expected = torch.zeros(model.cfg.d_model, dtype=torch.float64)
        for block in range(layer):
            for name in (f"blocks.{block}.attn.b_O", f"blocks.{block}.mlp.b_out"):
                expected = expected + parameters.get(name, torch.zeros(1, dtype=torch.float64))
        assert_close(model.accumulated_bias(layer), expected, rtol=0, atol=1e-12)


def test_decompose_resid_names_each_mixer_and_keeps_it_with_the_attention():
    _, cache = _run("in attention's place")
    _, labels = cache.decompose_resid(mode="attn", return_labels=True)
    assert labels == ["embed", "0_mamba2_out", "1_attn_out", "2_short_conv_out", "3_attn_out"]
    components = cache.decompose_resid()
    assert_close(components.sum(0), cache["blocks.3.hook_resid_post"], rtol=0, atol=1e-10)


def test_an_mlp_input_is_refused_in_a_block_without_an_mlp():
    _, cache = _run("one sublayer per block")
    for method in (cache.get_full_resid_decomposition, cache.decompose_resid):
        with pytest.raises(ValueError, match=r"block 2 holds no MLP .*'attention'.* \[1, 3\]"):
            method(2, mlp_input=True)
