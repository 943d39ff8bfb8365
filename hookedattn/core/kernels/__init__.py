"""How each sublayer runs, apart from what it computes.

The components (`hookedattn.core.components`) hold the equations; this package holds the
schedule: one call per sublayer decides how its equation runs in this forward.

    attend(attn, q, k, v, context)   written out, or one fused attention kernel, guarded
    normalize(norm, x)               written out, or one fused norm kernel
    FusedQKV                         q, k, v of one input by one product; kept weights
    AttentionContext                 masks and positions every layer of a forward shares,
                                     each mask built the first time a layer reads it
    guarded(model, run, guard, cache) a forward whose fused kernels' operands are checked
                                     for non-finite values once, where nothing listens
    mix_experts(moe, x, indices, w)  a mixture of experts, tokens grouped by expert
    mix(hook, fused, past, ...)      a state-space mixer's reads from its carried state, or
                                     its mixing matrix written out
    in_runs(step, tensors, state, n) a mixer's step over runs of n positions, state carried
    defer(module, inputs, *points)   a written-out value read later, from its inputs
    kept_view, transposed            a weight's views, kept between calls without grad

Every path gives the equation's numbers to the dtype's rounding, and never hides or spreads
a non-finite value; `use_fused_kernels=False` writes everything out, so that a cached run is
bit for bit the plain forward.
"""

from hookedattn.core.kernels._attention import (
    attend,
    fused_attention,
    fuses_attention,
    masked,
    weighted_values,
)
from hookedattn.core.kernels._deferred import defer
from hookedattn.core.kernels._experts import (
    Dispatch,
    checked_choice,
    dispatch,
    mix_experts,
    router_probabilities,
)
from hookedattn.core.kernels._guard import FiniteGuard, guarded
from hookedattn.core.kernels._masks import (
    AttentionContext,
    attention_context,
    next_token_context,
    rows_context,
)
from hookedattn.core.kernels._mixing import in_runs, mix
from hookedattn.core.kernels._norm import fused_normalize, fuses_norms, normalize
from hookedattn.core.kernels._qkv import FusedQKV, keeping_fused_weights
from hookedattn.core.kernels._views import kept_view, transposed

__all__ = [
    "AttentionContext",
    "Dispatch",
    "FiniteGuard",
    "FusedQKV",
    "attend",
    "attention_context",
    "checked_choice",
    "defer",
    "dispatch",
    "fused_attention",
    "fused_normalize",
    "fuses_attention",
    "fuses_norms",
    "guarded",
    "in_runs",
    "keeping_fused_weights",
    "kept_view",
    "masked",
    "mix",
    "mix_experts",
    "next_token_context",
    "normalize",
    "router_probabilities",
    "rows_context",
    "transposed",
    "weighted_values",
]
