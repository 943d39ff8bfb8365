"""Phi-3.5-MoE (`PhimoeForCausalLM`) imported by convention: its router is the sparsemixer
(`components.sparsemixer`), recognised by verification among the candidate scorings where
the config names a `router_jitter_noise`, its epsilon; LayerNorms and attention as Mixtral's.
Compared with `transformers` on a tiny random twin: logits and residual streams in float32,
the mixture block alone in float64 (transformers' rotary runs in float32, its mixture stays
in the model's dtype), and greedy generation."""

import pytest
import torch
from helpers.generation import greedy_ours_and_transformers
from helpers.twins import relative_worst, streams_worst, tiny_twin
from torch import nn

from hookedattn import HookedTransformer

transformers = pytest.importorskip("transformers")

TOKENS = torch.tensor(
    [[5, 17, 3, 42, 8, 8, 60, 1, 29, 77, 4, 12], [9, 2, 2, 71, 30, 6, 5, 14, 100, 3, 3, 50]]
)


def twin(seed: int = 0, **fields) -> nn.Module:
    """A tiny random Phi-3.5-MoE, as the verification builds one, with `fields` set."""
    return tiny_twin("phimoe", seed, **fields)


@pytest.mark.parametrize("jitter", [0.01, 0.3])
def test_phimoe_is_imported_with_its_sparsemixer(jitter):
    reference = twin(seed=3, router_jitter_noise=jitter)
    model = HookedTransformer.from_hf(reference)
    assert model.cfg.router_scoring == "sparsemixer"
    assert model.cfg.sparsemixer_jitter_eps == jitter
    assert streams_worst(model, reference, TOKENS) <= 1e-5


@pytest.mark.parametrize("jitter", [0.01, 0.3])
def test_phimoe_mixture_is_the_transformers_block_in_float64(jitter):
    reference = twin(seed=5, router_jitter_noise=jitter).double()
    model = HookedTransformer.from_hf(reference)
    x = torch.randn(2, 9, model.cfg.d_model, generator=torch.Generator().manual_seed(6),
                    dtype=torch.float64)  # fmt: skip
    with torch.no_grad():
        want = reference.model.layers[0].mlp(x.clone())
        got = model.blocks[0].mlp(x)
    assert relative_worst(got, want) <= 1e-12


def test_phimoe_greedy_generation_is_transformers():
    assert torch.equal(*greedy_ours_and_transformers(twin(seed=4), TOKENS[:, :5]))
