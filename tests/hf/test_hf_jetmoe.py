"""JetMoE (`_jetmoe`): a mixture of attention heads (every expert's heads, a routed gate
keeping the picked experts': `attn_gate="routed"`) and a mixture of experts, compared with
`transformers` on a tiny random twin: the logits and every residual stream in float32 and in
float64, greedy generation, the checkpoint's files; the routed gate against a loop."""

import dataclasses
import math

import pytest
import torch
from helpers.float64_hf import InFloat64Throughout
from helpers.generation import greedy_ours_and_transformers
from helpers.twins import (
    assert_decomposition_sums,
    assert_files_read_as_the_live_model,
    relative_worst,
    streams_worst,
    tiny_twin,
)

from hookedattn import HookedTransformer, HookedTransformerConfig

pytest.importorskip("transformers")

TOKENS = torch.tensor(
    [[5, 17, 3, 42, 8, 8, 60, 1, 29, 77, 4, 12], [9, 2, 2, 71, 30, 6, 5, 14, 100, 3, 3, 50]]
)


def twin(seed: int = 0, **fields) -> torch.nn.Module:
    """A tiny random JetMoE of two layers, four experts of two heads each, two picked."""
    fields = dict(num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2) | fields
    return tiny_twin("jetmoe", seed=seed, **fields)


def test_every_experts_heads_are_ours_grouped_over_the_shared_keys():
    reference = twin(seed=1)
    c, cfg = reference.config, HookedTransformer.from_hf(reference).cfg
    assert cfg.n_heads == c.num_local_experts * c.num_key_value_heads
    assert cfg.n_key_value_heads == c.num_key_value_heads
    assert (cfg.attn_gate, cfg.attn_gate_top_k) == ("routed", c.num_experts_per_tok)
    assert cfg.num_experts == c.num_local_experts


def test_logits_and_every_residual_stream_are_transformers_in_float32():
    reference = twin(seed=2)
    assert streams_worst(HookedTransformer.from_hf(reference), reference, TOKENS) <= 1e-5


def test_logits_and_every_residual_stream_are_transformers_in_float64():
    reference = twin(seed=3).double()
    model = HookedTransformer.from_hf(reference)
    assert streams_worst(model, InFloat64Throughout(reference), TOKENS) <= 1e-10


def test_greedy_generation_is_transformers():
    assert torch.equal(*greedy_ours_and_transformers(twin(seed=4), TOKENS[:, :5]))


def test_every_expert_kept_parts_from_transformers():
    # The gate keeping every expert, each weighted by the softmax over all: not JetMoE.
    reference = twin(seed=5).double()
    model = HookedTransformer.from_hf(reference)
    changed = HookedTransformer(dataclasses.replace(model.cfg, attn_gate_top_k=model.cfg.n_heads
                                                    // model.cfg.n_kv_heads))  # fmt: skip
    changed.load_state_dict(model.state_dict())
    with torch.no_grad():
        expected = InFloat64Throughout(reference)(TOKENS).logits
        assert relative_worst(model(TOKENS), expected) <= 1e-10
        assert relative_worst(changed(TOKENS), expected) > 1e-3


def test_the_routed_gate_is_a_loop_over_positions_and_groups():
    cfg = HookedTransformerConfig(n_layers=1, d_model=16, n_heads=6, n_key_value_heads=2,
                                  d_head=4, d_mlp=8, d_vocab=20, n_ctx=8, act_fn="silu",
                                  attn_gate="routed", attn_gate_per_head=True, attn_gate_top_k=2,
                                  dtype="float64", seed=0)  # fmt: skip
    model = HookedTransformer(cfg)
    _, cache = model.run_with_cache(torch.tensor([[1, 5, 9, 2]]))
    x = cache["blocks.0.ln1.hook_out"][0]
    attn = model.blocks[0].attn
    gate = cache["blocks.0.attn.hook_attn_gate"][0]
    for pos in range(x.shape[0]):
        for kv_head in range(2):
            heads = list(range(3 * kv_head, 3 * kv_head + 3))
            logits = [float(x[pos] @ attn.W_G[h, :, 0] + attn.b_G[h, 0]) for h in heads]
            picked = sorted(range(3), key=lambda i: -logits[i])[:2]
            total = sum(math.exp(logits[i]) for i in picked)
            for i, h in enumerate(heads):
                want = math.exp(logits[i]) / total if i in picked else 0.0
                assert abs(float(gate[pos, h, 0]) - want) <= 1e-12


def test_the_decomposition_of_an_import_sums_to_the_stream():
    model = HookedTransformer.from_hf(twin(seed=6).double())
    assert_decomposition_sums(model, TOKENS, ("sublayer", "head"))


def test_the_files_are_read_as_the_live_model(tmp_path):
    reference = twin(seed=7)
    reference.save_pretrained(tmp_path)
    assert_files_read_as_the_live_model(reference, tmp_path)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (dict(attn_gate_top_k=2), 'it needs attn_gate="routed"'),
        (dict(attn_gate="routed", attn_gate_per_head=True, attn_gate_top_k=4), "<= 3"),
        (dict(attn_gate="routed", attn_gate_top_k=1), "attn_gate_per_head=True"),
    ],
)
def test_a_routed_gate_that_cannot_route_is_refused_by_name(fields, message):
    with pytest.raises(ValueError, match=message):
        HookedTransformerConfig(n_layers=1, d_model=16, n_heads=6, n_key_value_heads=2,
                                d_head=4, d_mlp=8, d_vocab=20, n_ctx=8, **fields)  # fmt: skip
