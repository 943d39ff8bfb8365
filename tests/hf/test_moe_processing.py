"""Weight processing and circuits on the new shapes: a mixture of experts' norm folded into
its router and every expert (the routing unchanged), centred expert writes, value biases
refused under attention sinks, and the circuits of a grouped-query sink layer.
"""

import pytest
import torch
from helpers.moe import TOKENS, moe_model

from hookedattn import center_writing_weights, fold_layer_norm, fold_value_biases, process_weights

TOL = dict(rtol=0, atol=1e-10)


def run(model):
    with torch.no_grad():
        return model.run_with_cache(TOKENS)


@pytest.mark.parametrize(
    "shape",
    [dict(), dict(d_mlp_shared=10, shared_expert_gate=True), dict(swiglu_limit=0.7)],
)
def test_folding_the_norms_keeps_the_logits_the_routing_and_every_experts_rows(shape):
    model = moe_model(**shape)
    folded = fold_layer_norm(model)
    assert folded.cfg.normalization_type == "RMSPre"
    (logits, cache), (folded_logits, folded_cache) = run(model), run(folded)
    torch.testing.assert_close(folded_logits, logits, **TOL)
    for layer in (0, 1):
        assert torch.equal(folded_cache["expert_indices", layer], cache["expert_indices", layer])
        torch.testing.assert_close(
            folded_cache["router_logits", layer], cache["router_logits", layer], **TOL
        )
        for e in range(model.cfg.num_experts):
            torch.testing.assert_close(
                folded_cache["expert_pre", layer, e], cache["expert_pre", layer, e], **TOL
            )


def test_a_layernorm_mixture_folds_and_centres_its_expert_writes():
    model = moe_model(normalization_type="LN", positional_embedding_type="standard")
    processed = center_writing_weights(fold_layer_norm(model))
    logits, (new_logits, new_cache) = run(model)[0], run(processed)
    torch.testing.assert_close(new_logits, logits, **TOL)
    for layer in (0, 1):
        mean = new_cache["mlp_out", layer].mean(-1)
        torch.testing.assert_close(mean, torch.zeros_like(mean), **TOL)
    assert processed.blocks[0].mlp.W_out.mean(-1).abs().max() < 1e-12


def test_a_layernorm_bias_before_a_shared_experts_ungated_read_is_refused():
    model = moe_model(normalization_type="LN", d_mlp_shared=10)
    with pytest.raises(ValueError, match="a LayerNorm bias before a gated MLP"):
        fold_layer_norm(model)


def test_value_biases_are_not_folded_under_attention_sinks():
    model = moe_model(use_attn_sinks=True)
    with pytest.raises(ValueError, match="attention sinks .* sums to less than one"):
        fold_value_biases(model)
    processed = process_weights(model)  # every step that applies; value biases skipped
    torch.testing.assert_close(processed.blocks[1].attn._b_V, model.blocks[1].attn._b_V)
    logits, new_logits = run(model)[0], run(processed)[0]
    shift = new_logits - logits  # center_unembed: one constant per position
    torch.testing.assert_close(shift - shift.mean(-1, keepdim=True), torch.zeros_like(shift),
                               **TOL)  # fmt: skip


def test_the_circuits_of_a_grouped_query_sink_layer_are_per_query_head():
    model = moe_model(use_attn_sinks=True)
    attn = model.blocks[1].attn
    group = model.cfg.n_heads // model.cfg.n_kv_heads
    for head in range(model.cfg.n_heads):
        expected_qk = attn.W_Q[head] @ attn._W_K[head // group].T
        torch.testing.assert_close(model.QK[1, head].AB, expected_qk, **TOL)
        expected_ov = attn._W_V[head // group] @ attn.W_O[head]
        torch.testing.assert_close(model.OV[1, head].AB, expected_ov, **TOL)
