"""Phi-3.5-MoE's router, the SparseMixer (Liu et al. 2024, "GRIN: GRadient-INformed MoE",
arXiv 2409.12136), as it routes in inference: expert by expert, each the best of the
logits not chosen yet, weighed by a softmax over the experts whose logits lie close to it.

For slot s = 1..k, with `l` the router's logits of one token and `C` the experts chosen
in earlier slots:

    i_s    = argmax of l over the experts outside C               (hook_expert_indices)
    r      = l[i_s]
    near_s = {j outside C : (r - l[j]) / max(|l[j]|, r) <= 2 * jitter_eps}
    g_s    = exp(l[i_s]) / sum over j in near_s of exp(l[j])      (hook_expert_weights)

The weights are never renormalised over the chosen experts: each slot's softmax is its
own. `jitter_eps` is the checkpoint's `router_jitter_noise`; in training the choice is
sampled (Gumbel), which a frozen model never does. The choice is `MoE`'s top k of the
logits; an edited choice (a hook on the indices) is weighed the same way, `r` its own logit.
"""

import torch
from jaxtyping import Float, Int
from torch import Tensor

Logits = Float[Tensor, "batch pos expert"]


def sparsemixer_weights(
    logits: Logits, indices: Int[Tensor, "batch pos k"], jitter_eps: float
) -> Float[Tensor, "batch pos k"]:
    """Each slot's weight: the softmax of its expert's logit against the logits near it,
    among the experts earlier slots left (module docstring)."""
    taken = torch.zeros_like(logits, dtype=torch.bool)
    weights = []
    for slot in range(indices.shape[-1]):
        chosen = indices[..., slot : slot + 1]
        reference = logits.gather(-1, chosen)
        scale = logits.abs().clamp(min=reference)
        far = (reference - logits) / scale > 2 * jitter_eps
        near = logits.masked_fill(far | taken, -torch.inf)
        weights.append(near.softmax(dim=-1).gather(-1, chosen))
        taken = taken.scatter(-1, chosen, True)  # a later slot chooses among the rest
    return torch.cat(weights, dim=-1)
