"""How a mixture of experts runs: tokens grouped by expert, one product per expert.

The equations are `components.moe.MoE` (`route`, `expert`). Running them token by token, or
every expert on every token and masking, would cost a Python step per token or `num_experts
/ k` times the work; here each forward sorts its `(token, slot)` choices by expert once
(`dispatch`, a stable sort), gathers the rows in that order, runs each expert that has rows
on one contiguous slice of them (three products), weights each row by its router weight,
and adds the rows back to their tokens in one scatter (`index_add`). An expert no token
chose does not run, unless a hook is attached to one of its points, in which case it runs
on zero rows, so that its hooks (and a cache) see an empty `[0 ...]` activation.

Where no expert's hook point is active, no gradient is being recorded and the dtype allows
it (not float64), the experts' products run as three grouped matrix products over all the
rows at once (`torch.nn.functional.grouped_mm`, one call for every expert, each expert's
rows against its own weights): the same numbers to float rounding, without a Python step
per expert. (torch's CPU grouped product has no reliable backward, hence no gradients.)

A hook that replaces the chosen experts (`hook_expert_indices`) is checked to give expert
ids in range before they index anything.
"""

import dataclasses
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from hookedattn.core.shapes import Resid

_LOW_PRECISION = (torch.float16, torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class Dispatch:
    """The rows of one forward's expert choices, grouped by expert.

    `order[r]` is the flat `(token, slot)` index of row r (tokens in `(batch, pos)` order),
    `token[r]` its token, and `counts[e]` how many rows expert e has: expert e's rows are
    `counts[:e].sum()` onwards, in token order.
    """

    order: Int[Tensor, " row"]
    token: Int[Tensor, " row"]
    counts: list[int]


def dispatch(indices: Int[Tensor, "*tokens k"], num_experts: int) -> Dispatch:
    """The rows of `indices` (each token's chosen experts) grouped by expert, stably."""
    flat = indices.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()  # one synchronisation
    return Dispatch(order, order // indices.shape[-1], counts)


def router_probabilities(
    logits: Float[Tensor, "*tokens expert"],
) -> Float[Tensor, "*tokens expert"]:
    """`softmax(logits)` over the experts, in float32 for half-precision logits (as the
    reference implementations choose their experts), else in the logits' own dtype."""
    dtype = torch.float32 if logits.dtype in _LOW_PRECISION else logits.dtype
    return logits.softmax(dim=-1, dtype=dtype)


def mix_experts(
    moe: Any,
    x: Resid,
    indices: Int[Tensor, "batch pos k"],
    weights: Float[Tensor, "batch pos k"],
) -> Resid:
    """`sum over each token's choices of weight * moe.expert(e, x[token])`, grouped (the
    weight on the expert's input instead where `moe.rows_in` puts it there)."""
    batch, pos, d_model = x.shape
    plan = dispatch(indices, moe.num_experts)
    tokens = x.reshape(batch * pos, d_model)
    row_weights = weights.reshape(-1)[plan.order, None]
    rows = moe.rows_in(tokens[plan.token], row_weights)
    if _groups(moe, rows):
        out = _grouped_experts(moe, rows, plan, indices.reshape(-1)[plan.order])
    else:
        outputs, start = [], 0
        for e, count in enumerate(plan.counts):
            if count or moe.experts[e].is_active:
                outputs.append(moe.expert(e, rows[start : start + count]))
            start += count
        out = torch.cat(outputs) if outputs else rows
    weighted = moe.rows_out(out, row_weights)
    mixed = tokens.new_zeros(batch * pos, d_model).index_add_(0, plan.token, weighted)
    return mixed.view(batch, pos, d_model)


_GROUPED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _groups(moe: Any, rows: Tensor) -> bool:
    """Whether the experts may run as grouped products (module docstring)."""
    return (
        rows.dtype in _GROUPED_DTYPES
        and not torch.is_grad_enabled()
        and hasattr(torch.nn.functional, "grouped_mm")
        and not any(hooks.is_active for hooks in moe.experts)
    )


def _grouped_experts(
    moe: Any, rows: Float[Tensor, "row d_model"], plan: Dispatch, expert: Int[Tensor, " row"]
) -> Float[Tensor, "row d_model"]:
    """`moe.expert(e, rows of e)` for every expert at once: each product is one grouped call,
    and each row takes its own expert's bias."""
    ends = torch.tensor(plan.counts, device=rows.device).cumsum(0).to(torch.int32)

    def affine(x: Tensor, W: Tensor, b: Tensor) -> Tensor:
        out = torch.nn.functional.grouped_mm(x, W, offs=ends)
        # Most families' experts have no biases (zeros here): skip the per-row gather then.
        return out + b[expert] if bool(b.any()) else out

    return moe.experts_on_rows(rows, affine, _NO_HOOKS)


class _NoHooks:
    """Hook points that are the identity: every expert at once has none of its own."""

    @staticmethod
    def _identity(x: Tensor) -> Tensor:
        return x

    hook_in = hook_pre = hook_pre_linear = hook_post = hook_out = _identity


_NO_HOOKS = _NoHooks()


def checked_choice(moe: Any, indices: Int[Tensor, "batch pos k"]) -> Int[Tensor, "batch pos k"]:
    """`indices`, checked to be expert ids of `moe` when a hook may have replaced them (a
    `ValueError` naming the ids out of range); unchecked, at no cost, otherwise."""
    if moe.hook_expert_indices.is_active:
        _check_indices(indices, moe.num_experts)
    return indices


def _check_indices(indices: Tensor, num_experts: int) -> None:
    if indices.numel() and not (int(indices.min()) >= 0 and int(indices.max()) < num_experts):
        bad = sorted({int(i) for i in indices.flatten() if not 0 <= int(i) < num_experts})
        raise ValueError(
            f"hook_expert_indices holds expert ids {bad[:8]}, outside 0..{num_experts - 1}: "
            f"a hook there must choose among the model's {num_experts} experts"
        )
