"""Experts whose input the router's weight scales (`expert_input_weighted`, Llama 4): each
chosen expert computes `expert_e(g_e * x)`, `g_e = sigmoid(logit_e)`, and the outputs are
summed as they are, plus the shared expert. Checked in float64 against the mixture written
out token by token from the weights; each expert's term is its own `hook_out`, so the
residual stream's decomposition by expert and every identity still sum."""

import pytest
import torch
from helpers.moe import TOKENS, moe_model, one_expert

from hookedattn import HookedTransformerConfig

LLAMA4 = dict(router_scoring="sigmoid", expert_input_weighted=True, d_mlp_shared=10,
              experts_per_token=2, moe_layers=(False, True), d_mlp_dense=12)  # fmt: skip


def _by_token(moe, x: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        for p in range(x.shape[1]):
            v = x[b, p]
            logits = v @ moe.W_router + moe.b_router
            chosen = torch.topk(torch.sigmoid(logits) + moe.b_router_choice, 2).indices
            for e in chosen.tolist():
                out[b, p] += one_expert(moe, e, torch.sigmoid(logits[e]) * v)
            s = moe.shared_expert
            post = torch.nn.functional.silu(v @ s.W_gate) * (v @ s.W_in + s.b_in)
            out[b, p] += post @ s.W_out + s.b_out
    return out


def test_mixture_is_each_expert_on_its_weighted_input_summed() -> None:
    model = moe_model(**LLAMA4)
    _, cache = model.run_with_cache(TOKENS)
    x = cache["blocks.1.ln2.hook_normalized"] * model.blocks[1].ln2.w
    want = _by_token(model.blocks[1].mlp, x)
    torch.testing.assert_close(cache["blocks.1.hook_mlp_out"], want, rtol=0, atol=1e-12)


def test_an_expert_reads_its_tokens_times_their_weights() -> None:
    model = moe_model(**LLAMA4)
    _, cache = model.run_with_cache(TOKENS)
    indices, weights = (cache[f"blocks.1.mlp.hook_expert_{n}"] for n in ("indices", "weights"))
    batch, pos, slot = (indices == 3).nonzero(as_tuple=True)
    x = cache["blocks.1.ln2.hook_normalized"] * model.blocks[1].ln2.w
    want = x[batch, pos] * weights[batch, pos, slot, None]
    torch.testing.assert_close(cache["blocks.1.mlp.experts.3.hook_in"], want, rtol=0, atol=0)


def test_decomposition_by_expert_sums_to_the_stream() -> None:
    from analysis import decompose_resid

    model = moe_model(**LLAMA4)
    _, cache = model.run_with_cache(TOKENS)
    decomposition = decompose_resid(model, cache, granularity="expert")
    final = cache["blocks.1.hook_resid_post"]
    torch.testing.assert_close(decomposition.components.sum(0), final, rtol=0, atol=1e-10)


def test_every_residual_identity_holds() -> None:
    from hookedattn.testing import assert_residual_identities

    model = moe_model(**LLAMA4)
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    check = assert_residual_identities(model, cache)
    assert any("times blocks.1.mlp.hook_expert_weights" in s for s in check.checked)


def test_grouped_products_agree_with_the_loop_over_experts() -> None:
    model = moe_model(**LLAMA4, dtype="float32")
    with torch.no_grad():
        grouped = model(TOKENS)
    looped = model.run_with_cache(TOKENS)[0].detach()  # hooks attached: one expert at a time
    torch.testing.assert_close(grouped, looped, rtol=1e-5, atol=1e-5)


def test_input_weighting_needs_experts() -> None:
    with pytest.raises(ValueError, match="expert_input_weighted is a mixture-of-experts"):
        HookedTransformerConfig(n_layers=1, d_model=8, n_ctx=4, d_head=4, d_vocab=5, d_mlp=8,
                                expert_input_weighted=True)  # fmt: skip
