"""A mixture-of-experts MLP: a router that picks a few experts for each token, and the experts.

    logits  = x @ W_router + b_router                     (hook_router_logits)  [batch pos expert]
    chosen  = the k largest of softmax(logits)            (hook_expert_indices) [batch pos k]
    g       = softmax(logits)[chosen], / (their sum + norm_topk_eps) when norm_topk_prob,
              * w_expert_scale[chosen] when router_expert_scale (Gemma 4's per-expert scale)
                                                          (hook_expert_weights) [batch pos k]
    expert e, on the rows of the tokens that chose it (experts.{e}.hook_*: [row ...]):
      pre    = x @ W_gate[e] + b_gate[e]                  (hook_in is x itself; hook_pre)
      linear = x @ W_in[e] + b_in[e]                      (hook_pre_linear)
      post   = act(pre) * linear                          (hook_post)
      out    = post @ W_out[e] + b_out[e]                 (hook_out)
    routed  = sum over each token's k choices of g * out
              [`expert_input_weighted` (Llama 4): the expert reads g * x instead (hook_in
               holds it), and routed = sum of its outs as they are]
    mlp_out = routed + sigmoid(x @ W_shared_gate) * shared_expert(x)   (hook_shared_out)

Plain experts (`gated_mlp=False`, Nemotron-H's) have no gate: `pre = x @ W_in[e] + b_in[e]`
(hook_pre), `post = act(pre)` (hook_post), no `W_gate`, `b_gate` or `hook_pre_linear`; the
shared expert is then a plain MLP too.

DeepSeek V3's router (`router_scoring="sigmoid"`) scores each expert on its own and chooses
among groups of them (DeepSeek-V3 report, section 2.1.2: auxiliary-loss-free balancing):

    logits  = x @ W_router + b_router, at least float32   (hook_router_logits)
    s       = sigmoid(logits)
    chosen  = the k largest of s + b_router_choice, among the experts of the
              `topk_expert_groups` groups (of `n_expert_groups`) whose `group_score_experts`
              (2) best experts' s + b_router_choice sum highest   (hook_expert_indices)
    g       = s[chosen], / (their sum + norm_topk_eps) when norm_topk_prob,
              * routed_scaling_factor
                                                          (hook_expert_weights)

Llama 4's is the sigmoid router without groups, and a zero choice bias (it chooses the k
largest logits), its weights scaling the experts' inputs (`expert_input_weighted`): each
expert's term is still its own `hook_out`, so the terms sum to the routed output.

Ernie 4.5's (`"softmax_biased"`) is the softmax router in float32 with the choice bias:
`p = softmax(logits)`, chosen the k largest of `p + b_router_choice`, `g = p[chosen]`.

DeepSeek V2's is the softmax router with the same group limit (a group's score: its best
expert's, `group_score_experts=1`) and scaling, and no choice bias.

Phi-3.5-MoE's (`"sparsemixer"`) chooses the k largest logits, best first, and weighs each
by a softmax over the logits near it among those not chosen before
(`components.sparsemixer`, `sparsemixer_jitter_eps`).

`b_router_choice` (HF's `e_score_correction_bias`) steers which experts are chosen, never
their weights. A half-precision model routes in float32, as the reference does (which
routes in float32 in every dtype: a float64 model here routes in float64).

The router reads `x` too, or an input of its own where the block gives one (Gemma 4's,
`moe_beside_mlp`: the stream through a norm of the router's own, `ln_router`).

Each step reads the one before it through its hook point, so an edit there re-routes: edited
logits choose again; edited indices take their own probabilities as weights (renormalised as
the model does); edited weights mix as given; an edited expert output reaches exactly the
tokens routed to it. An expert's rows are its tokens in the order `(batch, pos, slot)`, the
order of `(hook_expert_indices == e).nonzero()`: a cache holds, per expert, only the rows
routing implies, and the routing tells which token each row is (`analysis.experts`).

The weights are stacked over experts (`W_in: [expert d_model d_mlp]`, ...), one tensor per
kind, so that a tensor-parallel split shards them along `expert`. How the rows are gathered,
computed expert by expert and scattered back is `kernels.mix_experts`; the equations are
here. GPT-OSS's experts (`swiglu_limit`) clamp before their SwiGLU and add one to the linear
read: `(clamp(linear, -l, l) + 1) * g * sigmoid(alpha g)`, `g = min(pre, l)`.
"""

from collections.abc import Callable
from typing import Any

import torch
from einops import rearrange, repeat
from jaxtyping import Float, Int
from torch import Tensor, nn

from hookedattn.core import kernels
from hookedattn.core.components.embed import _param, affine
from hookedattn.core.components.mlp import ACTIVATIONS, glu, make_mlp
from hookedattn.core.components.sparsemixer import sparsemixer_weights
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.shapes import Resid

Rows = Float[Tensor, "row d_model"]
Choice = Int[Tensor, "batch pos k"]
Weights = Float[Tensor, "batch pos k"]
Affine = Callable[[Tensor, Tensor, Tensor], Tensor]  # (rows, stacked W, stacked b) -> rows


class ExpertHooks(nn.Module):
    """One expert's hook points, each on the rows of the tokens routed to it: `hook_in`
    `[row d_model]`, `hook_pre`, `hook_pre_linear` (a gated expert's only), `hook_post`
    `[row d_mlp]`, `hook_out` `[row d_model]` (its output before the router's weight). Its
    weights are the MoE's, at index `e` of the expert axis."""

    def __init__(self, gated: bool = True) -> None:
        super().__init__()
        self.hook_in = HookPoint()
        self.hook_pre = HookPoint()
        if gated:
            self.hook_pre_linear = HookPoint()
        self.hook_post = HookPoint()
        self.hook_out = HookPoint()

    @property
    def is_active(self) -> bool:
        """Whether a hook is attached to any of this expert's points."""
        return any(point.is_active for point in self.children())


class MoE(nn.Module):
    """A router over `num_experts` experts (gated or plain, as `gated_mlp` says),
    `experts_per_token` per token, and an optional shared expert (module docstring)."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        n, d_model, d_mlp = cfg.num_experts, cfg.d_model, cfg.d_mlp
        self.num_experts, self.experts_per_token = n, cfg.experts_per_token
        self.W_router = _param(d_model, n, cfg=cfg)
        self.b_router = _param(n, cfg=cfg)
        if cfg.gated_mlp:
            self.W_gate = _param(n, d_model, d_mlp, cfg=cfg)
            self.b_gate = _param(n, d_mlp, cfg=cfg)
        self.W_in = _param(n, d_model, d_mlp, cfg=cfg)
        self.b_in = _param(n, d_mlp, cfg=cfg)
        self.W_out = _param(n, d_mlp, d_model, cfg=cfg)
        self.b_out = _param(n, d_model, cfg=cfg)
        self.act_fn = ACTIVATIONS[cfg.act_fn]
        self.swiglu_limit, self.swiglu_alpha = cfg.swiglu_limit, cfg.swiglu_alpha
        self.glu = self._swiglu if cfg.swiglu_limit is None else self._clamped_swiglu
        self.neurons = self._gated_neurons if cfg.gated_mlp else self._plain_neurons
        self.normalize = self._renormalized if cfg.norm_topk_prob else self._as_chosen
        self.norm_topk_eps = cfg.norm_topk_eps  # LFM2-MoE's 1e-6; 0 elsewhere
        self._add_scoring(cfg)
        # Where the router's weight multiplies: each row's input, or its output.
        on_input = cfg.expert_input_weighted
        self.rows_in = self._weighted_rows if on_input else self._rows_as_given
        self.rows_out = self._rows_as_given if on_input else self._weighted_rows
        self.hook_router_logits = HookPoint()  # [batch pos expert]
        self.hook_expert_indices = HookPoint()  # [batch pos k], int64
        self.hook_expert_weights = HookPoint()  # [batch pos k]
        self.experts = nn.ModuleList([ExpertHooks(cfg.gated_mlp) for _ in range(n)])
        self._add_shared_expert(cfg)

    def _add_scoring(self, cfg: HookedTransformerConfig) -> None:
        self.router_scoring = cfg.router_scoring
        self.weigh = self._gathered
        if cfg.router_scoring == "softmax":
            self.router_logits, self.scores = self._logits, kernels.router_probabilities
            self.choice_scores = self._as_chosen
        elif cfg.router_scoring == "sparsemixer":  # weighs the logits themselves
            self.router_logits, self.scores = self._logits, self._as_chosen
            self.choice_scores = self._as_chosen
            self.jitter_eps = cfg.sparsemixer_jitter_eps
            self.weigh = self._sparsemixer_weights
        else:  # "sigmoid", "softmax_biased": at least float32, chosen with a learned bias
            self.b_router_choice = _param(cfg.num_experts, cfg=cfg)
            self.router_logits = self._logits_at_least_float32
            biased_softmax = cfg.router_scoring == "softmax_biased"
            self.scores = kernels.router_probabilities if biased_softmax else torch.sigmoid
            self.choice_scores = self._with_choice_bias
        self.n_expert_groups, self.topk_expert_groups = cfg.n_expert_groups, cfg.topk_expert_groups
        self.group_score_experts = cfg.group_score_experts
        self.choose = self._group_limited_top_k if cfg.n_expert_groups > 1 else self._top_k
        self.routed_scaling_factor = cfg.routed_scaling_factor
        scaled = cfg.routed_scaling_factor != 1.0
        self.scaled = self._times_scaling_factor if scaled else self._as_chosen
        self.expert_scaled = self._as_chosen_by
        if cfg.router_expert_scale:  # Gemma 4: each expert's weight times its own scale
            self.w_expert_scale = _param(cfg.num_experts, cfg=cfg)
            self.expert_scaled = self._times_expert_scale

    def _add_shared_expert(self, cfg: HookedTransformerConfig) -> None:
        if cfg.d_mlp_shared is None:
            self.with_shared = self._routed_only
            return
        self.shared_expert = make_mlp(cfg, d_mlp=cfg.d_mlp_shared)
        if cfg.shared_expert_gate:
            self.W_shared_gate = _param(cfg.d_model, 1, cfg=cfg)
            self.hook_shared_gate = HookPoint()  # [batch pos 1]
            self.with_shared = self._gated_shared
        else:
            self.with_shared = self._plain_shared
        self.hook_shared_out = HookPoint()  # [batch pos d_model]

    def forward(self, x: Resid, router_input: Resid | None = None) -> Resid:
        """The mixture's output on `x`, routed by `router_input` (None: by `x`)."""
        indices, weights = self.route(x if router_input is None else router_input)
        routed = kernels.mix_experts(self, x, indices, weights)  # grouped by expert
        return self.with_shared(x, routed)

    def route(self, x: Resid) -> tuple[Choice, Weights]:
        """Which experts each token uses and with what weights, through the router's hooks."""
        logits = self.hook_router_logits(self.router_logits(x))
        scores = self.scores(logits)
        indices = self.hook_expert_indices(self.choose(scores))
        indices = kernels.checked_choice(self, indices)  # a hook's ids, in range
        weights = self.scaled(self.normalize(self.weigh(scores, indices)))
        weights = self.expert_scaled(weights, indices)
        return indices, self.hook_expert_weights(weights.to(x.dtype))

    def _logits(self, x: Resid) -> Float[Tensor, "batch pos expert"]:
        return affine(x, self.W_router, self.b_router)

    def _logits_at_least_float32(self, x: Resid) -> Float[Tensor, "batch pos expert"]:
        dtype = torch.promote_types(x.dtype, torch.float32)  # half precision: float32
        return affine(x.to(dtype), self.W_router.to(dtype), self.b_router.to(dtype))

    def _gathered(self, scores: Float[Tensor, "batch pos expert"], indices: Choice) -> Weights:
        return scores.gather(-1, indices)

    def _sparsemixer_weights(
        self, logits: Float[Tensor, "batch pos expert"], indices: Choice
    ) -> Weights:
        return sparsemixer_weights(logits, indices, self.jitter_eps)

    def _with_choice_bias(self, scores: Float[Tensor, "batch pos expert"]) -> Tensor:
        return scores + self.b_router_choice.to(scores.dtype)

    def _top_k(self, scores: Float[Tensor, "batch pos expert"]) -> Choice:
        return self.choice_scores(scores).topk(self.experts_per_token, dim=-1).indices

    def _group_limited_top_k(self, scores: Float[Tensor, "batch pos expert"]) -> Choice:
        """The k best experts by their choice scores, among the experts of the
        `topk_expert_groups` groups whose `group_score_experts` best experts score highest
        together."""
        choice = self.choice_scores(scores)
        grouped = rearrange(choice, "... (group member) -> ... group member",
                            group=self.n_expert_groups)  # fmt: skip
        best = grouped.topk(self.group_score_experts, dim=-1).values.sum(dim=-1)
        best_groups = best.topk(self.topk_expert_groups, dim=-1).indices
        kept = torch.zeros_like(best, dtype=torch.bool).scatter(-1, best_groups, True)
        kept = repeat(kept, "... group -> ... (group member)", member=grouped.shape[-1])
        return choice.masked_fill(~kept, -torch.inf).topk(self.experts_per_token, dim=-1).indices

    def _weighted_rows(self, rows: Rows, row_weights: Float[Tensor, "row 1"]) -> Rows:
        return rows * row_weights

    def _rows_as_given(self, rows: Rows, row_weights: Float[Tensor, "row 1"]) -> Rows:
        return rows

    def _times_scaling_factor(self, weights: Weights) -> Weights:
        return weights * self.routed_scaling_factor

    def _as_chosen_by(self, weights: Weights, indices: Choice) -> Weights:
        return weights

    def _times_expert_scale(self, weights: Weights, indices: Choice) -> Weights:
        return weights * self.w_expert_scale.to(weights.dtype)[indices]

    def expert(self, e: int, x: Rows) -> Rows:
        """Expert `e` on the rows of its tokens, unweighted, through its hook points."""
        return self.experts_on_rows(x, lambda x, W, b: torch.addmm(b[e], x, W[e]), self.experts[e])

    def experts_on_rows(self, x: Rows, affine: Affine, hooks: Any) -> Rows:
        """`post @ W_out + b_out` of rows `x`, `post` the experts' neurons (`neurons`):
        `affine(x, W, b)` picks each row's expert's weights from the stacked `W`, `b` (one
        expert's, or each row's own: `kernels.mix_experts`); `hooks` are the expert's hook
        points (or none)."""
        post = self.neurons(self.enter(hooks.hook_in(x)), affine, hooks)
        return hooks.hook_out(self.write(post, affine))

    def enter(self, x: Rows) -> Rows:
        """The rows the experts' neurons read: themselves (the step a split of the neurons
        over processes replaces, as the dense MLP's: `hookedattn.core.parallel`)."""
        return x

    def write(self, post: Float[Tensor, "row d_mlp"], affine: Affine) -> Rows:
        """The experts' write of their neurons `post`: `post @ W_out + b_out`, a sum over
        neurons (the other step a split replaces)."""
        return affine(post, self.W_out, self.b_out)

    def _gated_neurons(self, x: Rows, affine: Affine, hooks: Any) -> Float[Tensor, "row d_mlp"]:
        """`glu(x @ W_gate + b_gate, x @ W_in + b_in)`."""
        pre = hooks.hook_pre(affine(x, self.W_gate, self.b_gate))
        pre_linear = hooks.hook_pre_linear(affine(x, self.W_in, self.b_in))
        return hooks.hook_post(self.glu(pre, pre_linear))

    def _plain_neurons(self, x: Rows, affine: Affine, hooks: Any) -> Float[Tensor, "row d_mlp"]:
        """`act(x @ W_in + b_in)`."""
        pre = hooks.hook_pre(affine(x, self.W_in, self.b_in))
        return hooks.hook_post(self.act_fn(pre))

    def _swiglu(self, pre: Tensor, pre_linear: Tensor) -> Tensor:
        return glu(self.act_fn, pre, pre_linear)

    def _clamped_swiglu(self, pre: Tensor, pre_linear: Tensor) -> Tensor:
        limit = self.swiglu_limit
        gate, linear = pre.clamp(max=limit), pre_linear.clamp(min=-limit, max=limit)
        return (linear + 1) * (gate * torch.sigmoid(gate * self.swiglu_alpha))

    def _renormalized(self, chosen: Tensor) -> Tensor:
        return chosen / (chosen.sum(dim=-1, keepdim=True) + self.norm_topk_eps)

    def _as_chosen(self, chosen: Tensor) -> Tensor:
        return chosen

    def _routed_only(self, x: Resid, routed: Resid) -> Resid:
        return routed

    def _plain_shared(self, x: Resid, routed: Resid) -> Resid:
        return routed + self.hook_shared_out(self.shared_expert(x))

    def _gated_shared(self, x: Resid, routed: Resid) -> Resid:
        gate = self.hook_shared_gate(torch.sigmoid(x @ self.W_shared_gate))
        return routed + self.hook_shared_out(gate * self.shared_expert(x))
