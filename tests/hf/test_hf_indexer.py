"""DeepSeek V3.2 (`DeepseekV32ForCausalLM`) and GLM-MoE-DSA (`GlmMoeDsaForCausalLM`): latent
attention whose lightning indexer chooses each query's keys (`components.indexer`,
`hf._indexer`). Their tiny twins keep `index_topk=2` (`_tiny`), so that over 9 positions
every query from the third on drops keys and the choice reaches the logits. Compared with
`transformers`: logits in float64 and float32, each layer's attention write, the chosen
keys themselves, greedy generation with the KV cache (the indexer's keys cached too), a
saved directory; leaving the choice out moves the logits; a "shared" indexer layer is
refused."""

import pytest
import torch
from helpers.generation import greedy_ours_and_transformers
from helpers.twins import (
    assert_saved_twin_loads_like_the_live_model,
    attn_out_worsts,
    logits_worst,
    relative_worst,
    tiny_twin,
)
from torch import nn

from hookedattn import HookedTransformer

transformers = pytest.importorskip("transformers")

TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29], [9, 2, 2, 71, 30, 6, 5, 14, 100]])
FAMILIES = ["deepseek_v32", "glm_moe_dsa"]


@pytest.fixture(params=FAMILIES)
def model_type(request) -> str:
    return request.param


def twin(model_type: str, seed: int = 0, **fields) -> nn.Module:
    """A tiny random model of `model_type`, as the verification builds one."""
    return tiny_twin(model_type, seed, **fields)


def test_the_indexer_is_read_as_ours(model_type):
    cfg = HookedTransformer.from_hf(twin(model_type, seed=1)).cfg
    assert (cfg.index_topk, cfg.index_n_heads, cfg.index_head_dim) == (2, 4, 16)
    assert cfg.index_norm_eps == 1e-6 and cfg.indexer_layers is None
    assert cfg.kv_lora_rank == 32 and cfg.rotary_dim == 8


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_logits_are_transformers(model_type, dtype):
    """float64 to float32's rounding: transformers computes its rotary angles and norms in
    float32 even in a float64 model (as for DeepSeek V3)."""
    reference = twin(model_type, seed=2).to(dtype)
    assert logits_worst(reference, TOKENS) <= (1e-6 if dtype == torch.float64 else 1e-5)


def test_every_layer_writes_what_transformers_writes(model_type):
    for i, worst in enumerate(attn_out_worsts(twin(model_type, seed=3).double(), TOKENS)):
        assert worst <= 1e-6, i


def test_the_chosen_keys_are_transformers(model_type):
    """The keys each query reads (the pattern's nonzero entries) are the indices
    transformers' indexer returns, ties included (both take `torch.topk`)."""
    reference = twin(model_type, seed=4)
    model = HookedTransformer.from_hf(reference)
    chosen = {}
    for i, layer in enumerate(reference.model.layers):
        hook = lambda m, args, out, i=i: chosen.update({i: out.long()})
        layer.self_attn.indexer.register_forward_hook(hook)
    with torch.no_grad():
        reference(TOKENS)
        _, cache = model.run_with_cache(TOKENS)
    n = TOKENS.shape[1]
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    for i in range(model.cfg.n_layers):
        theirs = torch.zeros(2, n, n, dtype=torch.bool).scatter(-1, chosen[i], True) & causal
        ours = cache[f"blocks.{i}.attn.hook_pattern"][:, 0] > 0
        assert torch.equal(ours, theirs), i
        assert int(ours.sum(-1).max()) == 2  # every query past the second drops keys


def test_without_the_choice_the_import_would_differ(model_type):
    """The twin reaches the indexer: reading every key instead moves the logits far past
    the tolerance (so the verification on load would refuse an import without it)."""
    reference = twin(model_type, seed=5).double()
    model = HookedTransformer.from_hf(reference)
    unselected = HookedTransformer(model.cfg.replace(index_topk=None))
    state = {k: v for k, v in model.state_dict().items() if ".indexer." not in k}
    unselected.load_state_dict(state)
    with torch.no_grad():
        expected = reference(TOKENS).logits
        assert relative_worst(unselected(TOKENS), expected) > 1e-2


def test_greedy_generation_with_the_kv_cache_is_transformers(model_type):
    """From 3 positions to 13, each step scoring the indexer's cached keys."""
    got, expected = greedy_ours_and_transformers(
        twin(model_type, seed=6), TOKENS[:, :3], max_new_tokens=10
    )
    assert torch.equal(got, expected)


def test_a_saved_directory_loads_like_the_live_model(model_type, tmp_path):
    assert_saved_twin_loads_like_the_live_model(twin(model_type, seed=7), tmp_path)


def test_a_layer_sharing_an_earlier_choice_is_refused():
    reference = twin("glm_moe_dsa", seed=8, indexer_types=["full", "shared", "full", "full"])
    with pytest.raises(ValueError, match=r"indexer_types marks layers \[1\] 'shared'"):
        HookedTransformer.from_hf(reference)
