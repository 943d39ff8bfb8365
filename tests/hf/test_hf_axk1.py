"""A.X-K1 (`AXK1ForCausalLM`) imported by convention: DeepSeek V3's latent attention and
mixture of experts, with a norm of the mixture's whole output (`mlp.post_mlp_layernorm`,
routed plus shared experts) before it is added, our blocks' `ln2_post` where they hold
experts (`moe_out_norm`). Compared with `transformers` on a tiny random twin (one dense
layer, one with experts): the mixture block with its norm in float64, logits and residual
streams in float32, and greedy generation."""

import pytest
import torch
from helpers.generation import greedy_ours_and_transformers
from helpers.twins import assert_saved_twin_loads_like_the_live_model, relative_worst, tiny_twin
from torch import nn

from hookedattn import HookedTransformer
from hookedattn.core.components.norm import NoNorm

transformers = pytest.importorskip("transformers")

TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29], [9, 2, 2, 71, 30, 6, 5, 14, 100]])


def twin(seed: int = 0) -> nn.Module:
    """A tiny random A.X-K1, as the verification builds one (layer 0 dense, 1 sparse)."""
    return tiny_twin("axk1", seed)


def test_axk1_output_norm_is_ln2_post_of_the_blocks_with_experts():
    reference = twin(seed=1)
    model = HookedTransformer.from_hf(reference)
    assert model.cfg.moe_out_norm and isinstance(model.blocks[0].ln2_post, NoNorm)
    gain = reference.model.layers[1].mlp.post_mlp_layernorm.weight
    torch.testing.assert_close(model.blocks[1].ln2_post.w, gain, rtol=0, atol=0)


def test_axk1_mixture_and_its_norm_are_the_transformers_block_in_float64():
    """To float32's rounding: transformers' router and RMS norm compute in float32 even in a
    float64 model (the norm's input is compared too, so the norm is not what agrees)."""
    reference = twin(seed=2).double()
    model = HookedTransformer.from_hf(reference)
    x = torch.randn(2, 9, model.cfg.d_model, generator=torch.Generator().manual_seed(6),
                    dtype=torch.float64)  # fmt: skip
    hf_block, seen = reference.model.layers[1].mlp, {}
    hf_block.post_mlp_layernorm.register_forward_hook(lambda m, i, o: seen.update(x=i[0]))
    with torch.no_grad():
        want = hf_block(x.clone())
        mixture = model.blocks[1].mlp(x)
        got = model.blocks[1].ln2_post(mixture)
    assert relative_worst(mixture, seen["x"]) <= 1e-6
    assert relative_worst(got, want) <= 1e-6


def test_axk1_logits_and_residual_streams_are_transformers():
    reference = twin(seed=3)
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        expected = reference(TOKENS, output_hidden_states=True)
        logits, cache = model.run_with_cache(TOKENS)
    assert relative_worst(logits, expected.logits) <= 1e-5
    assert relative_worst(cache["blocks.0.hook_resid_post"], expected.hidden_states[1]) <= 1e-5


def test_axk1_greedy_generation_is_transformers():
    assert torch.equal(*greedy_ours_and_transformers(twin(seed=4), TOKENS[:, :5]))


def test_a_saved_directory_loads_like_the_live_model(tmp_path):
    assert_saved_twin_loads_like_the_live_model(twin(seed=5), tmp_path)
