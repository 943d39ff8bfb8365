"""Tiny mixtures of experts and the reference they are checked against: `moe_by_token`
computes each token's MLP output from the weights alone, one token and one chosen expert at
a time, with no dispatch, no hook point and no einsum shared with the model. Every weight,
bias and gain is random (the router's bias too), float64. Shared by the tests of the
mixture, its analysis, patching and processing."""

import torch

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.testing.models import randomize_parameters

BASE = dict(
    n_layers=2, d_model=16, n_heads=4, d_head=4, n_key_value_heads=2, n_ctx=16, d_vocab=23,
    d_mlp=8, gated_mlp=True, act_fn="silu", normalization_type="RMS",
    positional_embedding_type="rotary", num_experts=6, experts_per_token=2, dtype="float64",
    seed=0,
)  # fmt: skip
VARIANTS = {
    "softmax_weights": {},
    "renormalised": dict(norm_topk_prob=True),
    "gated_shared_expert": dict(d_mlp_shared=10, shared_expert_gate=True),
    "clamped_swiglu": dict(swiglu_limit=0.7, swiglu_alpha=1.702, norm_topk_prob=True),
}
TOKENS = torch.randint(0, 23, (2, 7), generator=torch.Generator().manual_seed(3))


def moe_model(**overrides) -> HookedTransformer:
    cfg = HookedTransformerConfig(**{**BASE, **overrides})
    return randomize_parameters(HookedTransformer(cfg), scale=0.5, seed=1)


def _glu(moe, pre: torch.Tensor, linear: torch.Tensor) -> torch.Tensor:
    if moe.swiglu_limit is None:
        return torch.nn.functional.silu(pre) * linear
    limit = moe.swiglu_limit
    gate, linear = pre.clamp(max=limit), linear.clamp(-limit, limit)
    return (linear + 1) * gate * torch.sigmoid(moe.swiglu_alpha * gate)


def one_expert(moe, e: int, x: torch.Tensor) -> torch.Tensor:
    """Expert `e` on one token's vector, from the weights."""
    pre = x @ moe.W_gate[e] + moe.b_gate[e]
    linear = x @ moe.W_in[e] + moe.b_in[e]
    return _glu(moe, pre, linear) @ moe.W_out[e] + moe.b_out[e]


def moe_by_token(moe, x, logits_fn=None, choose=None, weigh=None, drop=None) -> torch.Tensor:
    """The MoE's output token by token. `logits_fn(b, p, logits)`, `choose(b, p, indices)`
    and `weigh(b, p, weights)` replace a token's router logits, chosen experts and weights;
    `drop` is an expert whose output counts as zero."""
    cfg = moe.experts_per_token
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        for p in range(x.shape[1]):
            v = x[b, p]
            logits = v @ moe.W_router + moe.b_router
            if logits_fn is not None:
                logits = logits_fn(b, p, logits)
            probs = torch.softmax(logits, dim=-1)
            chosen = torch.topk(probs, cfg).indices
            if choose is not None:
                chosen = choose(b, p, chosen)
            weights = probs[chosen]
            if moe.normalize == moe._renormalized:
                weights = weights / weights.sum()
            if weigh is not None:
                weights = weigh(b, p, weights)
            for weight, e in zip(weights, chosen.tolist(), strict=True):
                if e != drop:
                    out[b, p] += weight * one_expert(moe, e, v)
            if hasattr(moe, "shared_expert"):
                s = moe.shared_expert
                post = torch.nn.functional.silu(v @ s.W_gate) * (v @ s.W_in + s.b_in)
                shared = post @ s.W_out
                gate = torch.sigmoid(v @ moe.W_shared_gate) if hasattr(moe, "W_shared_gate") else 1
                out[b, p] += gate * (shared + s.b_out)
    return out
