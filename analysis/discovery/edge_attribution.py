"""Edge attribution patching (EAP) and its integrated-gradients form (EAP-IG).

Patching edge `s -> r` moves receiver r's input by `delta_s = corrupted_term_s -
clean_term_s`. EAP (Syed, Rager and Conmy 2023) estimates the metric's change by its first
order, `delta_s . dm/d(input_r)`, the gradient taken in the clean run: one forward of the
corrupted prompts (for the terms), one of the clean prompts with the gradient recorded at
every receiver, one backward, for every edge at once.

EAP-IG (Hanna, Pezzelle and Belinkov 2024, "Have Faith in Faithfulness") averages that
gradient over `ig_steps` points on the straight line between the clean and the corrupted
*input embeddings* (the paper's main form, not its interpolation of activations): the
stream entering block 0 is `clean + a (corrupted - clean)` at the midpoints
`a = (k + 1/2) / ig_steps`, and the rest of the model runs on from there. The midpoint
rule is exact for a gradient linear in `a` and errs as `1/ig_steps^2` otherwise; the
paper's code takes `a = k / ig_steps` from the corrupted end, a rule that errs as
`1/ig_steps`. Each step is a forward and a backward of the clean prompts' batch; steps
run stacked on the batch axis, as many together as the memory budget allows.

Both are exact where the metric is linear in every receiver's input (no norms, attention
patterns that do not depend on the input, a metric linear in the logits); tests check
them against `edge_patching` there to float64 rounding.

More in `docs/guide/discovery.md`.
"""

from collections.abc import Callable, Sequence

import torch
from einops import einsum, rearrange
from jaxtyping import Float, Int
from torch import Tensor

from analysis.discovery._terms import Terms, sender_terms, split_model, term_hooks
from analysis.discovery.computational_graph import Graph
from analysis.discovery.scores import EdgeScores
from analysis.patching.engine import (
    Metric,
    default_memory_budget,
    itemsize,
    metric_gradients,
    metric_values,
    paired_tokens,
    row_floats,
    warn_if_tied,
)
from hookedattn.core.cache import ActivationCache
from hookedattn.core.model import HookedTransformer

ATTRIBUTION_METHODS = ("eap", "eap-ig")
DEFAULT_IG_STEPS = 5
FIRST = "blocks.0.hook_resid_pre"  # the stream entering block 0: the embeddings, summed

Gradients = dict[str, Tensor]  # receiver hook -> d metric / d input, [batch pos (head) d_model]


def edge_attribution(
    model: HookedTransformer,
    *,
    # [batch pos] token ids, loosely annotated so that bad input gets our own message.
    clean_tokens: object,
    corrupted_tokens: object,
    metric: Metric,
    method: str = "eap",
    # An int >= 1 or None, loosely annotated so that bad input gets our own message.
    ig_steps: object = None,
    memory_budget: int | None = None,
) -> EdgeScores:
    """Every edge's estimated change of the metric when it alone is patched (module docstring).

    `method` is `"eap"` or `"eap-ig"`; `ig_steps` (EAP-IG only; default 5) the number of
    points the gradient is averaged over. `metric` maps logits `[batch pos d_vocab]` to
    one value per prompt; with EAP-IG it is called once per step. `memory_budget` bounds
    the bytes one stacked pass of steps may hold. The model's parameters and their
    `.grad` are left untouched; hooks attached to `model` do not run (the passes run on a
    copy sharing its weights).
    """
    steps = _checked_steps(method, ig_steps)
    graph = Graph.from_model(model)
    split = split_model(model)
    clean_tokens, corrupted_tokens = paired_tokens(split, clean_tokens, corrupted_tokens)
    names = [*term_hooks(split), FIRST]
    # The terms need no per-head inputs: the corrupted run (and EAP-IG's clean one) runs
    # the attention's one fused projection.
    plain = split_model(model, qkv=False)
    with torch.no_grad():
        logits, corrupted = plain.run_with_cache(corrupted_tokens, names_filter=names)
    corrupted_metric = metric_values(metric, logits).detach()
    if method == "eap":
        clean_metric, gradients, clean = _eap_pass(split, graph, clean_tokens, metric, names)
    else:
        with torch.no_grad():
            logits, clean = plain.run_with_cache(clean_tokens, names_filter=names)
        clean_metric = metric_values(metric, logits).detach()
        budget = default_memory_budget(split) if memory_budget is None else memory_budget
        gradients = _ig_gradients(
            split, graph, clean[FIRST], corrupted[FIRST], metric, steps, budget
        )
    warn_if_tied(clean_metric, corrupted_metric)
    delta = sender_terms(split, corrupted, graph) - sender_terms(split, clean, graph)
    per_prompt = _edge_products(graph, delta, gradients)
    return EdgeScores(
        graph,
        method,
        per_prompt,
        clean_metric,
        corrupted_metric,
        steps if method == "eap-ig" else None,
    )


def _checked_steps(method: str, ig_steps: object) -> int:
    if method not in ATTRIBUTION_METHODS:
        raise ValueError(f"method must be one of {ATTRIBUTION_METHODS}, got {method!r}")
    if method == "eap":
        if ig_steps is not None:
            raise ValueError(
                f"ig_steps={ig_steps!r} is for method='eap-ig'; EAP takes the gradient once, "
                f"in the clean run"
            )
        return 1
    if ig_steps is None:
        return DEFAULT_IG_STEPS
    if not isinstance(ig_steps, int) or isinstance(ig_steps, bool) or ig_steps < 1:
        raise ValueError(f"ig_steps must be an int >= 1 (integration points), got {ig_steps!r}")
    return ig_steps


def _receiver_hooks(graph: Graph) -> list[str]:
    return list(dict.fromkeys(r.hook for r in graph.receivers))


def _eap_pass(
    split: HookedTransformer,
    graph: Graph,
    tokens: Int[Tensor, "batch pos"],
    metric: Metric,
    names: Sequence[str],
) -> tuple[Float[Tensor, " batch"], Gradients, ActivationCache]:
    """The clean run with the gradient at every receiver, and the activations at `names`."""
    kept: dict[str, Tensor] = {}

    def keep(activation: Tensor, hook) -> None:
        kept[hook.name] = activation.detach()

    forward = lambda: metric_values(metric, split(tokens))
    with split.hooks(fwd_hooks=[(name, keep) for name in names]):
        run = metric_gradients(split, _receiver_hooks(graph), forward)
    return run.value, run.gradients, ActivationCache(kept, split.cfg.n_layers)


def _ig_gradients(
    split: HookedTransformer,
    graph: Graph,
    clean: Float[Tensor, "batch pos d_model"],
    corrupted: Float[Tensor, "batch pos d_model"],
    metric: Metric,
    steps: int,
    budget: int,
) -> Gradients:
    """The gradient at every receiver averaged over the midpoints between the clean and
    the corrupted embeddings, steps stacked on the batch axis within `budget`."""
    alphas = (torch.arange(steps, dtype=clean.dtype, device=clean.device) + 0.5) / steps
    batch, n_pos = clean.shape[:2]
    # A backward holds about twice a forward's activations beside them.
    per_step = 3 * batch * n_pos * row_floats(split.cfg, n_pos) * itemsize(split.cfg)
    chunk = max(1, min(steps, budget // max(per_step, 1)))
    total: Gradients = {}
    for first in range(0, steps, chunk):
        a = alphas[first : first + chunk]
        stream = clean + a[:, None, None, None] * (corrupted - clean)
        run = metric_gradients(split, _receiver_hooks(graph), _stacked_steps(split, stream, metric))
        for name, grad in run.gradients.items():
            summed = rearrange(grad, "(step b) ... -> step b ...", step=len(a)).sum(0)
            total[name] = total[name] + summed if name in total else summed
    return {name: grad / steps for name, grad in total.items()}


def _stacked_steps(
    split: HookedTransformer, stream: Float[Tensor, "step batch pos d_model"], metric: Metric
) -> Callable[[], Tensor]:
    """The forward of the steps of `stream`, stacked on the batch axis: the metric summed."""

    def forward() -> Tensor:
        logits = split(rearrange(stream, "step b p d -> (step b) p d"), start_at_layer=0)
        logits = rearrange(logits, "(step b) p v -> step b p v", step=stream.shape[0])
        # One call per step: a metric may index its prompts (their answers) by batch row.
        return sum(metric_values(metric, logits[k]).sum() for k in range(stream.shape[0]))

    return forward


def _edge_products(graph: Graph, delta: Terms, gradients: Gradients) -> Float[Tensor, "edge batch"]:
    """`delta_s . gradient_r` summed over positions and d_model, for every edge, per prompt."""
    out = torch.zeros(len(graph), delta.shape[1], dtype=delta.dtype, device=delta.device)
    for hook in _receiver_hooks(graph):
        at = [i for i, r in enumerate(graph.receivers) if r.hook == hook]
        senders = list(graph.senders_of(at[0]))
        grad = gradients[hook].to(delta.dtype)
        if grad.ndim == 4:  # per head
            products = einsum(delta[senders], grad, "s b p d, b p head d -> s head b")
        else:
            products = einsum(delta[senders], grad, "s b p d, b p d -> s b")[:, None]
        row = {s: j for j, s in enumerate(senders)}
        for i, edge in enumerate(graph.edges):
            receiver = graph.receivers[edge.receiver]
            if receiver.hook == hook:
                out[i] = products[row[edge.sender], receiver.head or 0]
    return out
