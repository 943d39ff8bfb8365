"""DiffLlama (`DiffLlamaForCausalLM`, its family module `_diffllama`): Llama with
differential attention. Compared with `transformers` on tiny random twins (4 query heads,
keys and values per head or grouped in 2): the attention sublayer and the logits and
residual streams in float64 and float32, the residual decomposition, greedy generation, and
a saved directory. The sublayer's own float64 identities against a brute-force loop are
`tests/core/test_differential_attention.py`."""

import pytest
import torch
from helpers.generation import greedy_ours_and_transformers
from helpers.twins import (
    assert_saved_twin_loads_like_the_live_model,
    relative_worst,
    streams_worst,
    tiny_twin,
)
from torch import nn

from analysis import decompose_resid
from hookedattn import HookedTransformer
from hookedattn.core.kernels import attention_context

transformers = pytest.importorskip("transformers")

TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29], [9, 2, 2, 71, 30, 6, 5, 14, 100]])
GROUPINGS = {"per_head": {}, "grouped": {"num_key_value_heads": 2}}


def twin(grouping: str = "grouped", seed: int = 0) -> nn.Module:
    """A tiny random DiffLlama, as the verification builds one, its lambdas drawn at
    random (transformers draws them with `lambda_std_dev`; made larger here, so that
    `lambda` is far from `lambda_init`)."""
    model = tiny_twin("diffllama", seed, **GROUPINGS[grouping])
    generator = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lambda_" in name:
                param.copy_(0.5 * torch.randn(param.shape, generator=generator))
    return model


@pytest.mark.parametrize("grouping", GROUPINGS)
def test_diffllama_attention_is_the_transformers_module_in_float64(grouping):
    """On one random input, with transformers' rotary table and an explicit causal mask; to
    float32's rounding, as transformers sums `lambda_q1 * lambda_k1` in float32 whatever the
    model's dtype (1.0e-7 of the write's scale on this twin)."""
    reference = twin(grouping, seed=1).double()
    model = HookedTransformer.from_hf(reference)
    assert model.cfg.differential_attention
    x = torch.randn(2, 9, model.cfg.d_model, generator=torch.Generator().manual_seed(6),
                    dtype=torch.float64)  # fmt: skip
    positions = torch.arange(9)[None].expand(2, -1)
    mask = torch.full((9, 9), float("-inf"), dtype=torch.float64).triu(1)[None, None]
    context = attention_context(model.cfg.n_ctx, 2, 9, None, None, None, "cpu")
    with torch.no_grad():
        rotary = reference.model.rotary_emb(x, positions)
        want = reference.model.layers[1].self_attn(x, rotary, attention_mask=mask)[0]
        got = model.blocks[1].attn(x, x, x, context)
    assert relative_worst(got, want) <= 1e-6


@pytest.mark.parametrize("grouping", GROUPINGS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_diffllama_logits_and_residual_streams_are_transformers(grouping, dtype):
    reference = twin(grouping, seed=3).to(dtype)
    model = HookedTransformer.from_hf(reference)
    assert streams_worst(model, reference, TOKENS) <= 1e-5


def test_diffllama_residual_decomposition_sums_to_the_stream():
    model = HookedTransformer.from_hf(twin(seed=2).double())
    _, cache = model.run_with_cache(TOKENS)
    decomposition = decompose_resid(model, cache, granularity="head", check=True)
    assert torch.allclose(decomposition.sum(), cache[decomposition.hook_name], atol=1e-12)


@pytest.mark.parametrize("grouping", GROUPINGS)
def test_diffllama_greedy_generation_is_transformers(grouping):
    assert torch.equal(*greedy_ours_and_transformers(twin(grouping, seed=4), TOKENS[:, :5]))


def test_a_saved_directory_loads_like_the_live_model(tmp_path):
    assert_saved_twin_loads_like_the_live_model(twin(seed=5), tmp_path)


def test_an_imported_diffllama_saves_and_loads_unchanged(tmp_path):
    model = HookedTransformer.from_hf(twin(seed=6))
    loaded = HookedTransformer.load(model.save(tmp_path / "ours"))
    assert loaded.cfg.differential_attention
    with torch.no_grad():
        assert torch.equal(loaded(TOKENS), model(TOKENS))
