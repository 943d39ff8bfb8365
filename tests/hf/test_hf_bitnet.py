"""BitNet (`BitNetForCausalLM`) imported by convention: Llama's layer with two norms inside
its sublayers, read as ours (`_sub_norms`): `attn_sub_norm` over the heads' concatenated
outputs before `o_proj` (`attn.sub_norm`, `hook_z_normed`) and `ffn_sub_norm` over the
gated neurons before `down_proj` (`mlp.ln`). transformers' float forward quantises nothing
(its `nn.Linear` maps are plain), so a random twin is the model. Compared with it: each
sublayer in float64, logits in float32, and greedy generation."""

import pytest
import torch
from einops import rearrange
from helpers.generation import greedy_ours_and_transformers
from helpers.twins import (
    assert_saved_twin_loads_like_the_live_model,
    logits_worst,
    relative_worst,
    tiny_twin,
)
from torch import nn

from hookedattn import HookedTransformer

transformers = pytest.importorskip("transformers")

TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29], [9, 2, 2, 71, 30, 6, 5, 14, 100]])


def twin(seed: int = 0) -> nn.Module:
    """A tiny random BitNet, as the verification builds one."""
    return tiny_twin("bitnet", seed)


def test_bitnet_sub_norms_are_read_as_ours():
    reference = twin(seed=1)
    model = HookedTransformer.from_hf(reference)
    assert model.cfg.attn_sub_norm and model.cfg.mlp_sub_norm
    layer, block = reference.model.layers[1], model.blocks[1]
    heads = rearrange(layer.self_attn.attn_sub_norm.weight, "(head d_head) -> head d_head",
                      head=model.cfg.n_heads)  # fmt: skip
    torch.testing.assert_close(block.attn.sub_norm.w, heads, rtol=0, atol=0)
    torch.testing.assert_close(block.mlp.ln.w, layer.mlp.ffn_sub_norm.weight, rtol=0, atol=0)


def test_bitnet_sublayers_are_transformers_in_float64():
    """Each sublayer's write from the same normed stream; to float32's rounding, as
    transformers' RMS norms compute in float32 even in a float64 model."""
    reference = twin(seed=2).double()
    model = HookedTransformer.from_hf(reference)
    seen = {}
    for name in ("self_attn", "mlp"):
        module = getattr(reference.model.layers[1], name)
        module.register_forward_hook(lambda m, i, o, name=name: seen.update({name: o}))
    with torch.no_grad():
        reference(TOKENS)
        _, cache = model.run_with_cache(TOKENS)
    assert relative_worst(cache["blocks.1.hook_attn_out"], seen["self_attn"][0]) <= 1e-6
    assert relative_worst(cache["blocks.1.hook_mlp_out"], seen["mlp"]) <= 1e-6


def test_bitnet_logits_are_transformers():
    assert logits_worst(twin(seed=3), TOKENS) <= 1e-5


def test_bitnet_greedy_generation_is_transformers():
    assert torch.equal(*greedy_ours_and_transformers(twin(seed=4), TOKENS[:, :5]))


def test_a_saved_directory_loads_like_the_live_model(tmp_path):
    assert_saved_twin_loads_like_the_live_model(twin(seed=5), tmp_path)
