"""The identities of the newest blocks: attention sinks and mixtures of experts.

    pattern         = softmax([scores, sinks])[..., :-1]     (with sinks: rows sum below 1)
    router_logits   = x @ W_router + b_router
    expert_weights  = softmax(router_logits)[expert_indices] (/ their sum, norm_topk_prob)
    experts.e.in    = x at the tokens routed to e, in (batch, pos, slot) order
                      (times the token's weight for e, `expert_input_weighted`: Llama 4)
    experts.e.pre   = in @ W_gate[e] + b_gate[e],  pre_linear = in @ W_in[e] + b_in[e]
    experts.e.post  = act_fn(pre) * pre_linear     (clamped SwiGLU with swiglu_limit)
                      (plain experts: pre = in @ W_in[e] + b_in[e], post = act_fn(pre))
    experts.e.out   = post @ W_out[e] + b_out[e]
    mlp_out         = after(sum over each token's choices of weight * out + shared_out)
                      (each out as it is, `expert_input_weighted`)

`x` is the MLP's input (`ln2.hook_out`). An expert's rows are checked against the routing
the cache recorded; its weights are its slice of the stacked ones.
"""

import torch
from torch import nn

from hookedattn.core import names as _names
from hookedattn.testing._identity import (
    TERMS,
    VALUE,
    Get,
    Identity,
    NormAtScale,
    NotApplicableError,
    Sides,
    activation,
    gated_activation,
    linear,
    weight,
)

_READ = "... d_model, d_model d_mlp -> ... d_mlp"
_WRITE = "... d_mlp, d_mlp d_model -> ... d_model"


def sink_softmax(pattern: str, scores: str, sinks: nn.Parameter) -> Identity:
    """`pattern == softmax over [scores, sinks[h]]`, the sink's share dropped."""

    def sides(get: Get) -> Sides:
        s = get(scores)
        sink = weight(sinks, s)[None, :, None, None].expand(*s.shape[:-1], 1)
        expected = torch.cat([s, sink], dim=-1).softmax(dim=-1)[..., :-1]
        size = s.abs().where(s.isfinite(), 0.0)
        scale = expected * (1 + size + (expected * size).sum(dim=-1, keepdim=True) + sink.abs())
        return Sides(get(pattern), expected, scale)

    statement = f"{pattern} == softmax([{scores}, sinks]) over key_pos, the sink dropped"
    scale_is = "the pattern times the scores' magnitude"
    return Identity(statement, (pattern, scores), _names.axis_names(pattern), scale_is, sides)


def moe(
    moe_module: nn.Module,
    layer: int,
    x: str,
    post: NormAtScale | None,
    router_x: str | None = None,
    out: str | None = None,
) -> list[Identity]:
    """Every identity of a mixture of experts reading `x` (its router `router_x`, None: `x`)
    and written to `out` through `post` (None: `hook_mlp_out`), in the order it computes
    them."""
    m = f"blocks.{layer}.mlp"
    logits, indices, weights = (f"{m}.hook_{n}" for n in ("router_logits", "expert_indices",
                                                           "expert_weights"))  # fmt: skip
    written = out or _names.get_act_name("mlp_out", layer)
    out = [
        linear(logits, router_x or x, moe_module.W_router, moe_module.b_router,
               "... d_model, d_model expert -> ... expert", "W_router + b_router"),
        _routing_weights(weights, logits, indices, moe_module),
    ]  # fmt: skip
    for e in range(moe_module.num_experts):
        out += _expert(moe_module, m, e, x, indices)
    out.append(_mixture(moe_module, layer, post, written))
    return out


def _expert(moe_module: nn.Module, m: str, e: int, x: str, indices: str) -> list[Identity]:
    hook = lambda part: f"{m}.experts.{e}.hook_{part}"
    rows_in, pre, post, out = (hook(p) for p in ("in", "pre", "post", "out"))
    mod = moe_module
    return [
        _routed_rows(rows_in, x, indices, e, _weights_on(mod, m)),
        *(_gated_neurons(mod, e, rows_in, pre, post, hook("pre_linear")) if hasattr(mod, "W_gate")
          else _plain_neurons(mod, e, rows_in, pre, post)),
        linear(out, post, mod.W_out[e], mod.b_out[e], _WRITE, f"W_out[{e}] + b_out[{e}]"),
    ]  # fmt: skip


def _gated_neurons(
    mod: nn.Module, e: int, rows_in: str, pre: str, post: str, pre_linear: str
) -> list[Identity]:
    activations = (
        gated_activation(post, pre, pre_linear, mod.act_fn)
        if mod.swiglu_limit is None
        else _clamped(post, pre, pre_linear, mod.swiglu_limit, mod.swiglu_alpha)
    )
    return [
        linear(pre, rows_in, mod.W_gate[e], mod.b_gate[e], _READ, f"W_gate[{e}] + b_gate[{e}]"),
        linear(pre_linear, rows_in, mod.W_in[e], mod.b_in[e], _READ, f"W_in[{e}] + b_in[{e}]"),
        activations,
    ]


def _plain_neurons(mod: nn.Module, e: int, rows_in: str, pre: str, post: str) -> list[Identity]:
    return [
        linear(pre, rows_in, mod.W_in[e], mod.b_in[e], _READ, f"W_in[{e}] + b_in[{e}]"),
        activation(post, pre, mod.act_fn),
    ]


def _routing_weights(weights: str, logits: str, indices: str, moe_module: nn.Module) -> Identity:
    renormalised = moe_module.normalize == moe_module._renormalized
    scoring, factor = moe_module.router_scoring, moe_module.routed_scaling_factor

    def sides(get: Get) -> Sides:
        chosen = moe_module.weigh(moe_module.scores(get(logits)), get(indices).long())
        if renormalised:
            chosen = chosen / (chosen.sum(dim=-1, keepdim=True) + moe_module.norm_topk_eps)
        chosen = moe_module.expert_scaled(moe_module.scaled(chosen), get(indices).long())
        return Sides(get(weights), chosen, chosen)

    how = ", renormalised" if renormalised else ""
    scores = f"{scoring}({logits})"
    scaled = f" * {factor:g}" if factor != 1.0 else ""
    each = " * w_expert_scale" if hasattr(moe_module, "w_expert_scale") else ""
    statement = f"{weights} == {scores}[{indices}]{how}{scaled}{each}"
    return Identity(statement, (weights, logits, indices), _names.axis_names(weights), VALUE, sides)


def _weights_on(moe_module: nn.Module, m: str) -> str | None:
    """The block's `hook_expert_weights` where they scale the experts' inputs, else None."""
    on_input = moe_module.rows_in == moe_module._weighted_rows
    return f"{m}.hook_expert_weights" if on_input else None


def _routed_rows(rows: str, x: str, indices: str, expert: int, weights: str | None) -> Identity:
    def sides(get: Get) -> Sides:
        chosen = get(indices) == expert
        if chosen.ndim == 2:  # a cache without its batch axis
            chosen = chosen[None]
        batch, pos, slot = chosen.nonzero(as_tuple=True)
        stream = get(x)
        stream = stream if stream.ndim == 3 else stream[None]
        if stream.shape[1] != chosen.shape[1]:
            raise NotApplicableError("a pos_slice keeps some positions, an expert all its rows")
        expected = stream[batch, pos]
        if weights is not None:
            g = get(weights)
            expected = expected * (g if g.ndim == 3 else g[None])[batch, pos, slot, None]
        return Sides(get(rows), expected, expected.abs())

    weighted = f" times {weights}" if weights else ""
    statement = f"{rows} == {x}{weighted} at the tokens routed to expert {expert}"
    needs = (rows, x, indices, *((weights,) if weights else ()))
    return Identity(statement, needs, _names.axis_names(rows), VALUE, sides)


def _clamped(post: str, pre: str, pre_linear: str, limit: float, alpha: float) -> Identity:
    def sides(get: Get) -> Sides:
        gate, linear_ = get(pre).clamp(max=limit), get(pre_linear).clamp(-limit, limit)
        expected = (linear_ + 1) * gate * torch.sigmoid(alpha * gate)
        return Sides(get(post), expected, expected.abs())

    statement = f"{post} == clamped SwiGLU of {pre}, {pre_linear} (limit {limit:g})"
    return Identity(statement, (post, pre, pre_linear), _names.axis_names(post), VALUE, sides)


def _mixture(moe_module: nn.Module, layer: int, post: NormAtScale | None, mlp_out: str) -> Identity:
    m = f"blocks.{layer}.mlp"
    indices, weights = f"{m}.hook_expert_indices", f"{m}.hook_expert_weights"
    outs = [f"{m}.experts.{e}.hook_out" for e in range(moe_module.num_experts)]
    on_input = _weights_on(moe_module, m) is not None
    shared = [f"{m}.hook_shared_out"] if hasattr(moe_module, "hook_shared_out") else []

    def sides(get: Get) -> Sides:
        chosen, g = get(indices), get(weights)
        if chosen.ndim == 2:
            chosen, g = chosen[None], g[None]
        total = torch.zeros(*chosen.shape[:2], get(outs[0]).shape[-1], dtype=torch.float64)
        size = torch.zeros_like(total)
        for e, name in enumerate(outs):
            batch, pos, slot = (chosen == e).nonzero(as_tuple=True)
            term = get(name) if on_input else g[batch, pos, slot, None] * get(name)
            total.index_put_((batch, pos), term, accumulate=True)
            size.index_put_((batch, pos), term.abs(), accumulate=True)
        for name in shared:
            s = get(name)
            s = s if s.ndim == 3 else s[None]
            total, size = total + s, size + s.abs()
        if post is not None:
            total, size = post.apply(get, total, size)
        actual = get(mlp_out)
        return Sides(actual if actual.ndim == 3 else actual[None], total, size)

    terms = "sum of each token's weighted expert outputs" + (" + shared_out" if shared else "")
    statement = f"{mlp_out} == {terms if post is None else f'{post.path}({terms})'}"
    needs = (mlp_out, indices, weights, *outs, *shared, *((post.scale,) if post else ()))
    return Identity(statement, needs, _names.axis_names(mlp_out), TERMS, sides)
