"""`assert_residual_identities`: every equation the forward promises, checked on a cache.

The residual stream is a sum. Each block reads it and adds what it writes, and each write
is itself a sum over heads or neurons; so a cache of one forward satisfies, in order:

    resid_pre[0]   = embed + pos_embed                      (embed alone: rotary, none,
                                                             shortformer)
    attn_in[h]     = resid_pre                              (per-head input copies)
    q, k, v        = ln1.out @ W_Q, W_K, W_V + biases       (resid_pre where no ln1;
                                                             shortformer: (ln1.out +
                                                             pos_embed) @ W_Q, W_K)
    q_norm.normalized = q / q_norm.scale, q_norm.out = w q_norm.normalized (likewise k)
    attn_scores    = cap(q k^T / attn_scale)                (unmasked entries; rot_q, rot_k
                                                             or the normed q, k if any;
                                                             q_tuned where it is)
    pattern        = softmax(attn_scores), rows sum to 1, 0 on future keys
                     and, in a local layer, on keys window_size or more positions back
    z              = pattern @ v
    attn_out       = after(sum_h result[h] + b_O) = after(sum_h z[h] @ W_O[h] + b_O)
    resid_mid      = resid_pre + attn_out                   (attn-only: resid_post)
    mlp_in         = resid_mid                              (parallel: resid_pre)
    pre            = ln2.out @ W_in + b_in,         post = act_fn(pre)
                     solu_ln: mid = solu(pre), post = mlp.ln.out
                     gated: pre = x @ W_gate, pre_linear = x @ W_in + b_in,
                            post = act_fn(pre) * pre_linear
    mlp_out        = after(post @ W_out + b_out)
                     a mixture of experts: the router and each expert's rows, and
                     mlp_out = after(sum of each token's weighted expert outputs + shared)
                     (`_moe_identities`); with attention sinks the pattern is the softmax
                     with each head's sink logit, its rows summing below one
    resid_post     = resid_mid + mlp_out                    (parallel: resid_pre +
                                                             attn_out + mlp_out)
    resid_pre[L+1] = resid_post[L]
    unembed.in     = ln_final.out,         unembed.out = cap(unembed.in @ W_U + b_U)

with `<norm>.out` a norm's output after its gain and bias (`hook_normalized` is before
them), GQA keys and values one per key/value head (each query head reads its group's),
`after` the norm after a sublayer (`ln1_post`, `ln2_post`; the identity elsewhere) and `cap`
a soft cap (`c tanh(x / c)`; the identity elsewhere). A hybrid model's mixer takes the
attention's lines' place (`_mixer_identities`: what it reads and writes, its mixing causal),
and a block of an MLP alone has `resid_post = resid_pre + mlp_out`.

Besides, for every norm whose input is cached (`ln1`, `ln2`, `ln_final`, the q/k norms,
a `solu_ln` MLP's `mlp.ln`):

    <norm>.hook_scale      = sqrt(mean(centre(x)^2) + eps)  (centre: x - mean x for LayerNorm,
    <norm>.hook_normalized = centre(x) / <norm>.hook_scale   x itself for RMSNorm)

written out from the formulas, never by calling the model's modules. A norm after a sublayer
is applied at the divisor its forward recorded, so its gain, bias and centring are checked
and its divisor is not (its input is not cached). The rotation of q and k is not recomputed.

The constants (what the scores are divided by, the norms' epsilon) are the published ones
(`hookedattn.testing.published`), not the model's config: a config that disagrees fails,
naming the constant, unless the caller states the model's own (`constants=`), so that a
wrong default cannot move the model and its check together.

An identity is checked when all its activations are in the cache, and skipped (and listed
as skipped) otherwise.
"""

import dataclasses

import torch

from hookedattn.core.cache import ActivationCache
from hookedattn.core.model import HookedTransformer
from hookedattn.core.tolerances import Tolerance
from hookedattn.testing._compare import (
    ToleranceUsed,
    axes_for,
    find_mismatch,
    loosest_tolerance,
    numbered,
)
from hookedattn.testing._identity import Get, NotApplicableError
from hookedattn.testing._model_identities import all_identities
from hookedattn.testing.published import Constants, checkpoint_constants, published_constants


@dataclasses.dataclass(frozen=True)
class IdentityCheck:
    """What `assert_residual_identities` checked (all held) and what it skipped, and why."""

    checked: tuple[str, ...]
    skipped: tuple[str, ...]
    tolerance: ToleranceUsed

    def __repr__(self) -> str:
        lines = [
            f"IdentityCheck: {len(self.checked)} identities hold at {self.tolerance}, "
            f"{len(self.skipped)} skipped"
        ]
        lines += [f"  ok    {s}" for s in self.checked]
        lines += [f"  skip  {s}" for s in self.skipped]
        return "\n".join(lines)


def assert_residual_identities(
    model: HookedTransformer,
    cache: ActivationCache,
    *,
    tol: Tolerance | None = None,
    constants: Constants | None = None,
) -> IdentityCheck:
    """Assert that every residual-stream identity (module docstring) holds on `cache`.

    `cache` is one forward of `model` (any `names_filter`, `pos_slice`, `dtype` or batch
    axis). The tolerance is the loosest of the cache's and the model's dtypes (from
    `hookedattn.core.tolerances`) unless `tol` is given. The constants are, unless
    `constants` is given: for a model imported from a checkpoint, those its checkpoint's
    config states (`checkpoint_constants`, from `model.checkpoint_config`); otherwise the
    published ones (`published_constants(d_head)`; for a model that sets its own, state
    them from its source, `published_constants(d_head, eps=1e-6)`). Where the model's
    config disagrees with them, that is a failure too. Raises `AssertionError`
    naming each failing identity with its largest error, where it is and the bound it
    broke, or when no identity could be checked at all. Returns what was checked and what
    was skipped.
    """
    if not isinstance(cache, ActivationCache):
        raise TypeError(f"cache must be an ActivationCache, got {type(cache).__name__}")
    # The chosen experts (int64) are ids, not values with a rounding error.
    dtypes = {t.dtype for t in cache.values() if t.is_floating_point()} | {model.cfg.dtype}
    used = loosest_tolerance(dtypes, tol)
    get: Get = lambda name: cache[name].to(torch.float64)
    constants = constants or _model_constants(model)
    checked, skipped, failures = [], [], []
    # The rotation is not recomputed here, so the rotary base is not among the constants used.
    for line in constants.disagreements(model.cfg, ("attn_scale", "eps")):
        failures.append((f"constant {line.split(':')[0]}", line + _STATE_HINT))
    for identity in all_identities(model, constants):
        missing = [n for n in identity.needs if n not in cache]
        if missing:
            skipped.append(f"{identity.statement}  [not cached: {', '.join(missing)}]")
            continue
        try:
            sides = identity.sides(get)
        except NotApplicableError as why:
            skipped.append(f"{identity.statement}  [{why}]")
            continue
        checked.append(identity.statement)
        mismatch = find_mismatch(sides.actual, sides.expected, sides.scale, used.tol)
        if mismatch is not None:
            axes = axes_for(identity.axes, sides.actual.ndim)
            failures.append((identity.statement, mismatch.describe(axes, used, identity.scale_is)))
    if failures:
        raise AssertionError(_failure_message(failures, len(checked), skipped, used))
    if not checked and skipped:  # a 0-layer model has no identities; that is not a failure
        raise AssertionError(
            f"none of the {len(skipped)} residual-stream identities could be checked on this "
            f"cache of {len(cache)} activations:\n  " + "\n  ".join(skipped)
        )
    return IdentityCheck(tuple(checked), tuple(skipped), used)


def _model_constants(model: HookedTransformer) -> Constants:
    """The constants to check `model` against: its checkpoint's own config where it was
    imported from one (an outside record), the published ones for a model built here."""
    source = getattr(model, "checkpoint_config", None)
    if source:
        return checkpoint_constants(model.cfg.d_head, source)
    return published_constants(model.cfg.d_head)


_STATE_HINT = (
    "\nfor a model that sets its own, state it from its source: "
    "constants=published_constants(d_head, <name>=<value>)"
)


def _failure_message(
    failures: list[tuple[str, str]], n_checked: int, skipped: list[str], used: ToleranceUsed
) -> str:
    lines = [f"{len(failures)} of {n_checked} residual-stream identities fail at {used}:"]
    lines += numbered(failures)
    lines.append(
        "Look first at the earliest failure in forward order: an activation edited in place "
        "after it was cached, a hook that replaced one activation but not what reads it, or "
        "activations taken from two different runs break these."
    )
    if skipped:
        lines.append(f"Skipped {len(skipped)}: " + "; ".join(s.split("  [")[0] for s in skipped))
    return "\n".join(lines)
