"""How an attention output gate turns its pre-activation into each head's factor
(`attn_gate`): `z * gate(x @ W_G + b_G)`, the product in `Attention._gated`.

`sigmoid` and `softplus` act on each entry (per dimension of `z`, or one factor per head).
The routed gate (`"routed"`, JetMoE's mixture of attention heads: `hf._jetmoe`) picks, in
each key/value group, the `attn_gate_top_k` query heads of the largest logits and weighs
them by the softmax of those logits; every other head's factor is 0, so an expert that is
not picked adds nothing.
"""

import functools
from collections.abc import Callable

import torch
from einops import rearrange
from jaxtyping import Float
from torch import Tensor

from hookedattn.core.config import HookedTransformerConfig

GATES = {"sigmoid": torch.sigmoid, "softplus": torch.nn.functional.softplus}


def make_gate(cfg: HookedTransformerConfig) -> Callable[[Tensor], Tensor]:
    """The gate `cfg.attn_gate` names, as a function of the pre-activation."""
    if cfg.attn_gate == "routed":
        group = cfg.n_heads // cfg.n_kv_heads
        return functools.partial(routed_gate, group=group, top_k=cfg.attn_gate_top_k)
    return GATES[cfg.attn_gate]


def routed_gate(
    pre: Float[Tensor, "batch pos head 1"], group: int, top_k: int
) -> Float[Tensor, "batch pos head 1"]:
    """In each key/value group of `group` query heads, the `top_k` heads of the largest
    logits `pre`, weighted by the softmax of those logits; every other head's factor 0."""
    logits = rearrange(pre, "batch pos (kv_head group) 1 -> batch pos kv_head group",
                       group=group)  # fmt: skip
    chosen_logits, chosen = logits.topk(top_k, dim=-1)
    gate = torch.zeros_like(logits).scatter(-1, chosen, chosen_logits.softmax(dim=-1))
    return rearrange(gate, "batch pos kv_head group -> batch pos (kv_head group) 1")
