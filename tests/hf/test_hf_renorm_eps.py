"""The epsilon a router adds to its chosen weights' sum before renormalising by it
(`norm_topk_eps`): LFM2-MoE's 1e-6, which `transformers` writes into its router. Read on
import, it makes the float64 import exact; left out, the logits move by about it."""

import pytest
import torch
from helpers.float64_hf import InFloat64Throughout
from helpers.twins import relative_worst, tiny_twin

from hookedattn import HookedTransformer, HookedTransformerConfig

transformers = pytest.importorskip("transformers")

TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29, 11], [9, 2, 2, 71, 30, 6, 5, 14, 100, 4]])


def twin(seed: int):
    """A tiny random LFM2-MoE in float64, renormalising its chosen experts' weights."""
    return tiny_twin("lfm2_moe", seed=seed, norm_topk_prob=True).double()


def test_lfm2_moe_reads_its_routers_epsilon():
    cfg = HookedTransformer.from_hf(twin(seed=0)).cfg
    assert cfg.norm_topk_prob and cfg.norm_topk_eps == 1e-6


def test_lfm2_moe_logits_are_transformers_in_float64_throughout():
    reference = twin(seed=1)
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        assert relative_worst(model(TOKENS), InFloat64Throughout(reference)(TOKENS).logits) < 1e-10


def test_without_the_epsilon_the_logits_move():
    reference = twin(seed=2)
    model = HookedTransformer.from_hf(reference)
    changed = HookedTransformer(model.cfg.replace(norm_topk_eps=0.0))
    changed.load_state_dict(model.state_dict())
    with torch.no_grad():
        assert relative_worst(changed(TOKENS), InFloat64Throughout(reference)(TOKENS).logits) > 1e-8


def test_an_epsilon_without_renormalising_is_refused():
    with pytest.raises(ValueError, match="norm_topk_eps=1e-06 .* needs norm_topk_prob=True"):
        HookedTransformerConfig(
            n_layers=1, d_model=8, n_ctx=8, d_head=4, d_vocab=16, d_mlp=8,
            num_experts=4, experts_per_token=2, norm_topk_eps=1e-6,
        )  # fmt: skip
