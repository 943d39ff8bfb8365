"""Scoring every head against a target attention pattern: previous-token, duplicate-token,
induction (prefix matching), or one of your own.

A target is a `[batch query_pos key_pos]` weight on the keys each query "should" attend
to, built from the tokens. A head's score is the attention it puts on the target, averaged
over the queries that have a target at all (the first position has no previous token; a
token seen once has no duplicate):

    score(head) = mean over queries q with a target of  Σ_k pattern[q, k] · target[q, k]

A score means little without a reference: each result carries the score that uniform
causal attention (`1 / (q + 1)` on each key `k <= q`) would get on the same tokens, the
level a head that ignores its input reaches. Scores are averaged over the batch.

Grouped-query attention changes nothing here (patterns are per query head). In a model
with local (windowed) layers a head there reaches only the `window_size` latest keys, so
ignoring its input means uniform attention over those: each such layer has its own
baseline (`layer_baselines`). In a hybrid model the blocks without heads (a mixer in
attention's place) score NaN, and `top` leaves them out.
"""

import dataclasses
from collections.abc import Callable, Sequence

import torch
from einops import einsum, reduce
from jaxtyping import Float, Int
from torch import Tensor

from analysis._naming import head_label, parse_head
from analysis.tables import Table
from hookedattn.core.cache import ActivationCache
from hookedattn.core.model import HookedTransformer
from hookedattn.core.patterns import record_patterns, stacked_patterns
from hookedattn.viewer import html_table

Target = Float[Tensor, "batch query_pos key_pos"]
TargetFn = Callable[[Int[Tensor, "batch pos"]], Tensor]


def _earlier(n: int, device: torch.device) -> Float[Tensor, "query_pos key_pos"]:
    return torch.ones(n, n, device=device).tril(-1)


def _previous_token_target(tokens: Int[Tensor, "batch pos"]) -> Target:
    """Query `q` should attend to key `q - 1`."""
    batch, n = tokens.shape
    return torch.ones(n - 1, device=tokens.device).diag(-1).expand(batch, n, n)


def _duplicate_token_target(tokens: Int[Tensor, "batch pos"]) -> Target:
    """Query `q` should attend to every earlier key `k < q` holding the same token."""
    same = (tokens[:, :, None] == tokens[:, None, :]).float()
    return same * _earlier(tokens.shape[1], tokens.device)


def _induction_target(tokens: Int[Tensor, "batch pos"]) -> Target:
    """Query `q` should attend to every earlier key `k < q` whose previous token is `q`'s.

    In `A B ... A`, the second `A` attends to `B`: the token that followed `A` last time.
    """
    n = tokens.shape[1]
    previous = torch.cat([torch.full_like(tokens[:, :1], -1), tokens[:, :-1]], dim=1)
    follows = (tokens[:, :, None] == previous[:, None, :]).float()
    return follows * _earlier(n, tokens.device)


TARGETS: dict[str, TargetFn] = {
    "previous_token": _previous_token_target,
    "duplicate_token": _duplicate_token_target,
    "induction": _induction_target,
}


@dataclasses.dataclass(frozen=True, repr=False)
class HeadScores:
    """One score per head, `[layer head]`, and the uniform-attention `baseline` beside it.

    `baseline` is that of causal attention over every earlier key; `layer_baselines`, one
    per layer, is given where layers differ in the keys they reach (local windows), and is
    empty otherwise.
    """

    scores: Float[Tensor, "layer head"]
    baseline: float
    detector: str
    layer_baselines: tuple[float, ...] = ()

    def __getitem__(self, head: str | tuple[int, int]) -> float:
        """The score of one head: `scores["L1H2"]` or `scores[1, 2]`."""
        layer, index = parse_head(head, *self.scores.shape)
        return float(self.scores[layer, index])

    def top(self, k: int = 5) -> Table:
        """The `k` highest-scoring heads."""
        n_heads, flat = self.scores.shape[1], self.scores.flatten()
        scored = flat.isnan().logical_not().nonzero().flatten()  # a hybrid's mixers: NaN
        values, chosen = flat[scored].topk(min(k, len(scored)))
        order = scored[chosen]
        rows = tuple(
            (head_label(i // n_heads, i % n_heads), float(v))
            for i, v in zip(order.tolist(), values, strict=True)
        )
        title = f"top {k} {self.detector} heads (uniform attention scores {self.baseline:.4g})"
        return Table(("head", "score"), rows, title)

    def to_table(self) -> Table:
        """Every score, one row per layer and one column per head."""
        columns = ("layer", *(f"H{h}" for h in range(self.scores.shape[1])))
        rows = tuple((f"L{i}", *row) for i, row in enumerate(self.scores.tolist()))
        title = f"{self.detector} scores (uniform attention scores {self.baseline:.4g})"
        return Table(columns, rows, title)

    def __repr__(self) -> str:
        n_layers, n_heads = self.scores.shape
        best = ", ".join(f"{label} {value:.3f}" for label, value in self.top(3).rows)
        return (
            f"HeadScores({self.detector}: {n_layers} layers × {n_heads} heads, "
            f"uniform baseline {self.baseline:.3f}; top {best})"
        )

    def _repr_html_(self) -> str:
        """A notebook's table: the `[layer head]` grid, the baseline above it."""
        table = self.to_table()
        return html_table(table.columns, table.rows, table.title, shade=True)


def _score_patterns(
    patterns: Float[Tensor, "layer batch head query_pos key_pos"],
    target: Target,
    detector: str,
    windows: Sequence[int | None] | None = None,
    layers: Sequence[int] | None = None,
    n_layers: int | None = None,
) -> HeadScores:
    """Score attention patterns against a target (see the module docstring).

    `windows`: per layer, the attention window (`window_size` of a local layer) or None
    (every earlier key); given with a window, the result has `layer_baselines`. `layers`:
    the blocks the patterns are of, of `n_layers` (None: all); the others score NaN.
    """
    has_target = target.sum(-1) > 0  # [batch query_pos]
    n_queries = int(has_target.sum())
    if n_queries == 0:
        raise ValueError(
            f"no query position has a {detector} target in these tokens (e.g. no token "
            f"repeats), so no head can be scored"
        )
    mass = einsum(
        patterns.to(target.dtype),
        target,
        "layer batch head query_pos key_pos, batch query_pos key_pos -> layer batch head query_pos",
    )
    kept = mass * has_target[None, :, None, :]
    scores = reduce(kept, "layer batch head query_pos -> layer head", "sum") / n_queries
    baseline = _uniform_baseline(target, has_target, None)
    layer_baselines: tuple[float, ...] = ()
    if windows is not None and any(w is not None for w in windows):
        layer_baselines = tuple(_uniform_baseline(target, has_target, w) for w in windows)
    if layers is not None:  # the blocks without heads: NaN
        every = scores.new_full((n_layers, scores.shape[1]), torch.nan)
        every[list(layers)] = scores
        scores = every
        if layer_baselines:
            by_layer = dict(zip(layers, layer_baselines, strict=True))
            layer_baselines = tuple(by_layer.get(layer, torch.nan) for layer in range(n_layers))
    return HeadScores(scores, baseline, detector, layer_baselines)


def _uniform_baseline(target: Target, has_target: Tensor, window: int | None) -> float:
    """The score of uniform attention over the keys a query reaches (all earlier ones, or
    the `window` latest)."""
    n = target.shape[-1]
    reached = torch.ones(n, n, dtype=target.dtype, device=target.device).tril()
    if window is not None:
        reached = reached.triu(1 - window)
    uniform = reached / reached.sum(-1, keepdim=True)
    return float((uniform * target).sum(-1)[has_target].sum()) / int(has_target.sum())


def repeated_random_tokens(
    d_vocab: int, seq_len: int, n_repeats: int = 2, seed: int = 0, batch: int = 8
) -> Int[Tensor, "batch pos"]:
    """`batch` random sequences of `seq_len` tokens, each repeated `n_repeats` times."""
    generator = torch.Generator().manual_seed(seed)
    segment = torch.randint(0, d_vocab, (batch, seq_len), generator=generator)
    return segment.repeat(1, n_repeats)


def _patterns(
    model: HookedTransformer, cache: ActivationCache
) -> Float[Tensor, "layer batch head query_pos key_pos"]:
    stacked = stacked_patterns(cache, model.cfg.attention_layers, "a head detector")
    return stacked if cache.has_batch_dim else stacked[:, None]


def detect_head(
    model: HookedTransformer,
    target: str | TargetFn,
    cache: ActivationCache | None = None,
    tokens: Int[Tensor, "batch pos"] | None = None,
    *,
    seq_len: int | None = None,
    n_repeats: int = 2,
    seed: int = 0,
    batch: int = 8,
) -> HeadScores:
    """Score every head against `target`: a name in `TARGETS`, or `fn(tokens) -> target`.

    A function returns `[batch query_pos key_pos]` (or `[query_pos key_pos]`) weights on
    the keys each query should attend to. The patterns come from `cache` (then `tokens`
    are those it was run on; only `"previous_token"` can do without them), or from running
    the model on `tokens`, or on `repeated_random_tokens(d_vocab, seq_len, n_repeats,
    seed, batch)` when neither is given (`seq_len` defaults to `n_ctx // n_repeats`).
    """
    if isinstance(target, str):
        if target not in TARGETS:
            raise ValueError(f"unknown target {target!r}: the named ones are {list(TARGETS)}")
        name, fn = target, TARGETS[target]
    elif callable(target):
        name, fn = getattr(target, "__name__", "custom"), target
    else:
        raise TypeError(f"target must be a name in {list(TARGETS)} or a function of tokens")
    if cache is None:
        if tokens is None:
            seq_len = model.cfg.n_ctx // n_repeats if seq_len is None else seq_len
            tokens = repeated_random_tokens(model.cfg.d_vocab, seq_len, n_repeats, seed, batch)
        cache = record_patterns(model, tokens.to(model.cfg.device))
    patterns = _patterns(model, cache)
    if tokens is None:
        if name != "previous_token":
            raise ValueError(f"the {name} target depends on the tokens: pass tokens=")
        tokens = torch.zeros(patterns.shape[1], patterns.shape[-1], dtype=torch.long)
    tokens = tokens.to(patterns.device)
    if tokens.ndim == 1:
        tokens = tokens[None]
    weights = torch.as_tensor(fn(tokens), device=patterns.device)
    expected = (patterns.shape[1], *patterns.shape[-2:])
    try:
        weights = torch.broadcast_to(weights, expected)
    except RuntimeError:
        raise ValueError(
            f"the {name} target has shape {tuple(weights.shape)}; the patterns need "
            f"[batch query_pos key_pos] = {list(expected)}"
        ) from None
    dtype = patterns.dtype if patterns.dtype.is_floating_point else torch.float32
    cfg = model.cfg
    layers = cfg.attention_layers
    windows = [cfg.window_size if cfg.layer_attn_type(layer) == "local" else None
               for layer in layers]  # fmt: skip
    return _score_patterns(patterns, weights.to(dtype), name, windows, layers, cfg.n_layers)


def prev_token_scores(model: HookedTransformer, cache: ActivationCache) -> HeadScores:
    """How much each head attends to the previous token, against the uniform baseline."""
    return detect_head(model, "previous_token", cache)


def duplicate_token_scores(
    model: HookedTransformer, cache: ActivationCache, tokens: Int[Tensor, "batch pos"]
) -> HeadScores:
    """How much each head attends to earlier copies of the current token."""
    return detect_head(model, "duplicate_token", cache, tokens)


def induction_scores(
    model: HookedTransformer,
    seq_len: int | None = None,
    n_repeats: int = 2,
    seed: int = 0,
    *,
    batch: int = 8,
    cache: ActivationCache | None = None,
    tokens: Int[Tensor, "batch pos"] | None = None,
) -> HeadScores:
    """How much each head attends to the token after an earlier copy of the current one.

    By default on `batch` random sequences of `seq_len` tokens repeated `n_repeats` times
    (the standard induction test: in the repeats, an induction head attends `seq_len - 1`
    back); or on a given `cache` and its `tokens`.
    """
    return detect_head(
        model,
        "induction",
        cache,
        tokens,
        seq_len=seq_len,
        n_repeats=n_repeats,
        seed=seed,
        batch=batch,
    )
