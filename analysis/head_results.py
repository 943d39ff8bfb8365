"""What each attention head writes into the residual stream, and from which source position.

A layer's attention output is a sum over heads, and each head's write is a sum over the
source positions it attends to (`residual["sat"] = x_in["sat"] + Σ_j A[sat, j] x_in[j] W_OV`
in the worklog the project started from, `docs/guide/worklog.md`):

    attn_out[dest]        = Σ_h result_h[dest] + b_O
    result_h[dest]        = z_h[dest] @ W_O[h]
                          = Σ_src A_h[dest, src] · (x[src] @ W_V[h] + b_V[h]) @ W_O[h]

where `x` is the value input, the layer's `ln1`-normalised stream (`hook_v` is
`x @ W_V[h] + b_V[h]`, bias included). Because each pattern row sums to one, `b_V[h] @ W_O[h]`
is written once per head whatever the pattern; it flows through the head, and is part of
its result, unlike `b_O`, which belongs to no head.

Grouped-query attention changes none of this: each query head reads its group's key/value
head, and `hook_v` (one per key/value head) is shown once for every query head reading it.
A norm after the attention (`ln1_post`: Gemma 2, OLMo 2) stands between the heads and the
stream, and its divisor depends on all heads together; with that divisor fixed at the
value the forward recorded, the norm is linear, so each head's term through it
(`head_writes`) is exact as a term of a sum (the terms, the norm of `b_O`, and a LayerNorm's
bias add up to `hook_attn_out`), though not what the head would write if it were alone.
A norm of every head's `z` together before `W_O` (BitNet's `attn_sub_norm`) is inside
the attention: `W_O` reads the normed `z` (`hook_z_normed`, one divisor per position shared
by the heads), so each head's result is `zn_h @ W_O[h]` (`_written_z`), and they still sum.
More in `docs/guide/decomposition.md`.
"""

import dataclasses
from collections.abc import Sequence

import torch
from einops import einsum, rearrange, reduce, repeat
from jaxtyping import Float
from torch import Tensor

from analysis._naming import head_label, parse_head
from analysis._reading import activation, weight
from analysis.normalization import NormSite, normalize, through_norm
from analysis.tables import Table
from hookedattn.core.cache import ActivationCache
from hookedattn.core.model import HookedTransformer


def _layer(model: HookedTransformer, layer: int) -> int:
    n_layers = model.cfg.n_layers
    if not isinstance(layer, int) or isinstance(layer, bool) or not -n_layers <= layer < n_layers:
        raise ValueError(f"layer must be an int in 0..{n_layers - 1} (or negative), got {layer!r}")
    return layer % n_layers


def _written_z(model: HookedTransformer) -> str:
    """The kind of the heads' outputs `W_O` reads: "z", or "z_normed" behind a sub-norm of
    the heads' outputs (`attn_sub_norm`) or differential attention's norm of each pair of
    heads (`differential_attention`: W_O's heads are the pairs), where `hook_z` is before
    it."""
    return "z_normed" if model.cfg.attn_sub_norm or model.cfg.differential_attention else "z"


def head_results(
    model: HookedTransformer, cache: ActivationCache, layer: int
) -> Float[Tensor, "batch pos head d_model"]:
    """Each head's output `z_h @ W_O[h]`, at one layer (TransformerLens's `hook_result`).

    Read from `hook_result` when the cache has it (models built with `use_attn_result`),
    computed from `hook_z` otherwise. Summed over heads, plus `b_O`, it is the attention's
    output: `attn_out` itself, or, in a block with a norm after the attention
    (`ln1_post`), that norm's input; `head_writes` is what reaches the stream.
    """
    layer = _layer(model, layer)
    model.cfg.require_attention(f"head_results of layer {layer}", [layer])
    if ("result", layer) in cache:
        return activation(cache, ("result", layer))
    kind = _written_z(model)
    if (kind, layer) not in cache:
        raise KeyError(
            f"head_results of layer {layer} needs blocks.{layer}.attn.hook_result or "
            f"blocks.{layer}.attn.hook_{kind} in the cache; neither is there (was a "
            f"names_filter used?)"
        )
    z = activation(cache, (kind, layer))
    W_O = weight(model.layer_weight(layer, "attn", "W_O"), z)
    return einsum(z, W_O, "batch pos head d_head, head d_head d_model -> batch pos head d_model")


def stacked_head_results(
    model: HookedTransformer, cache: ActivationCache, layers: Sequence[int] | None = None
) -> Float[Tensor, "layer head batch pos d_model"]:
    """Every layer's `head_results`, in one tensor, head-major within each layer.

    `layers`: the blocks to stack, in order (None: every block). Index `i` of the first
    axis is block `layers[i]`. A hybrid model's blocks with a mixer in attention's place
    have no heads, so there `layers` is needed, `model.cfg.attention_layers` for every block
    with heads (their writes are terms of `decompose_resid`, `L0_mamba2`, ...).

    The numbers are `head_results`' (read from `hook_result` where cached, `z_h @ W_O[h]`
    otherwise); they are written layer by layer into a tensor allocated once, so that
    `rearrange(stack, "layer head ... -> (layer head) ...")` (TransformerLens's
    `stack_head_results` order) is a view, not a copy.
    """
    layers = _stacked_layers(model, layers)
    kind = _written_z(model)
    first = layers[0]
    z = activation(cache, (kind, first)) if (kind, first) in cache else None
    first = z if z is not None else head_results(model, cache, first)
    batch, pos, n_heads = first.shape[:3]
    stack = first.new_empty((len(layers), n_heads, batch, pos, model.cfg.d_model))
    for i, layer in enumerate(layers):
        computed = (kind, layer) in cache and ("result", layer) not in cache
        z = activation(cache, (kind, layer)) if computed else None
        if z is None or (z.requires_grad and torch.is_grad_enabled()):  # out= has no autograd
            results = head_results(model, cache, layer)
            by_head = rearrange(results, "batch pos head d_model -> head batch pos d_model")
            stack[i].copy_(by_head)
        else:
            _results_into(stack[i], z, weight(model.layer_weight(layer, "attn", "W_O"), z))
    return stack


def _stacked_layers(model: HookedTransformer, layers: Sequence[int] | None) -> list[int]:
    """The blocks `stacked_head_results` stacks: `layers`, checked (every block if None),
    each with heads, and all of one shape."""
    cfg = model.cfg
    if layers is None:
        if cfg.attention_layers != list(range(cfg.n_layers)):
            others = [layer for layer in range(cfg.n_layers) if layer not in cfg.attention_layers]
            raise ValueError(
                f"stacked_head_results stacks every block by default, but blocks {others} of "
                f"this hybrid model have no heads (a mixer in attention's place); pass "
                f"layers=model.cfg.attention_layers ({cfg.attention_layers}) to stack the "
                f"blocks with heads"
            )
        layers = range(cfg.n_layers)
    layers = [_layer(model, layer) for layer in layers]
    if not layers:
        raise ValueError("stacked_head_results needs at least one block to stack (layers=[])")
    cfg.require_attention("stacked_head_results", layers)
    cfg.require_one_attention_shape("stacked_head_results", layers=layers)
    return layers


def _results_into(
    out: Float[Tensor, "head batch pos d_model"],
    z: Float[Tensor, "batch pos head d_head"],
    W_O: Float[Tensor, "head d_head d_model"],
) -> None:
    """`out[h] = z[..., h, :] @ W_O[h]`: one batched product written straight into `out`
    (contiguous), the same product, to the bit, as `head_results`' einsum."""
    z_heads = rearrange(z, "batch pos head d_head -> head (batch pos) d_head")
    flat_out = out.view(out.shape[0], -1, out.shape[-1])  # head (batch pos) d_model, a view
    torch.bmm(z_heads, W_O, out=flat_out)


def head_writes(
    model: HookedTransformer, cache: ActivationCache, layer: int
) -> Float[Tensor, "batch pos head d_model"]:
    """Each head's term of what the attention writes into the stream, at one layer.

    `head_results` itself, except in a block with a norm after the attention (`ln1_post`),
    where each head's result goes through that norm at the divisor cached at its
    `hook_scale` (centred for LayerNorm, times its gain; see the module docstring). Summed
    over heads, with `b_O` through the same map and the norm's bias, it is `attn_out`.
    Needs `blocks.{layer}.ln1_post.hook_scale` in the cache for such blocks.
    """
    layer = _layer(model, layer)
    results = head_results(model, cache, layer)
    heads = rearrange(results, "batch pos head d_model -> head batch pos d_model")
    labels = tuple(head_label(layer, h) for h in range(heads.shape[0]))
    heads, _ = through_norm(model, cache, NormSite("ln1_post", layer), heads, labels)
    # A LayerNorm's bias, appended as one more term, belongs to the sublayer, not a head.
    return rearrange(heads[: len(labels)], "head batch pos d_model -> batch pos head d_model")


def head_values(
    model: HookedTransformer, cache: ActivationCache, layer: int
) -> Float[Tensor, "batch pos head d_head"]:
    """The values `x @ W_V[h] + b_V[h]` of one layer: `hook_v` if cached, else recomputed.

    One per query head: with grouped-query attention each key/value head's values are
    shown for every query head of its group. Recomputed from the cached `resid_pre`
    through the block's `ln1` (the value input of an unpatched forward); when the cache
    has `hook_v`, that is what the model used. A model that norms its values
    (`use_v_norm`, Gemma 4) is read at the norm's output, what its heads read, which the
    cache must hold (`blocks.L.attn.v_norm.hook_out`). A block reading an earlier block's
    keys and values (`n_kv_shared_layers`) reads that block's values, which these are.
    """
    layer = _layer(model, layer)
    n_heads = model.cfg.attention_config(layer).n_heads
    source = model.cfg.kv_source_layer(layer)
    layer = layer if source is None else source
    read = ("v_norm_out", layer) if model.cfg.use_v_norm else ("v", layer)
    if model.cfg.use_v_norm and read not in cache:
        raise ValueError(
            f"this model norms its values (use_v_norm): the values its heads read are "
            f"blocks.{layer}.attn.v_norm.hook_out, which the cache does not hold"
        )
    if read in cache:
        v = activation(cache, read)
        group = n_heads // v.shape[2]
        return repeat(
            v, "batch pos kv_head d_head -> batch pos (kv_head group) d_head", group=group
        )
    x = normalize(model, NormSite("ln1", layer), activation(cache, ("resid_pre", layer)))
    W_V, b_V = (model.layer_weight(layer, "attn", w) for w in ("W_V", "b_V"))
    v = einsum(x, weight(W_V, x), "batch pos d_model, head d_model d_head -> batch pos head d_head")
    return v + weight(b_V, x)


@dataclasses.dataclass(frozen=True, repr=False)
class SourceContributions:
    """What each head of one layer moved from each source position to each destination.

    `contributions[b, h, i, j]` is `A_h[dest, src] · v_h[src] @ W_O[h]` for destination
    `query_positions[i]` and source `j`; summed over sources it is the head's term of the
    stream (`sum_sources()` equals `head_writes` at those positions). In a block with a
    norm after the attention, each contribution is passed through it at the destination's
    cached divisor (module docstring). `pattern` holds the attention weights
    `A_h[dest, src]` alongside.
    """

    contributions: Float[Tensor, "batch head query_pos key_pos d_model"]
    pattern: Float[Tensor, "batch head query_pos key_pos"]
    layer: int
    query_positions: tuple[int, ...]

    def __getitem__(self, head: str | int) -> Float[Tensor, "batch query_pos key_pos d_model"]:
        """One head's contributions, by label (`"L1H2"`) or by head index."""
        if isinstance(head, str):
            layer, index = parse_head(head, self.layer + 1, self.contributions.shape[1])
            if layer != self.layer:
                raise KeyError(f"{head!r} is not in layer {self.layer}")
            head = index
        return self.contributions[:, head]

    def sum_sources(self) -> Float[Tensor, "batch query_pos head d_model"]:
        """Each head's result at the destination positions (the sum over sources)."""
        return reduce(
            self.contributions,
            "batch head query_pos key_pos d_model -> batch query_pos head d_model",
            "sum",
        )

    def top(self, k: int = 10, batch: int = 0, query_pos: int | None = None) -> Table:
        """The `k` (head, source) pairs that wrote the most (by norm) into one destination."""
        dest = self.query_positions[-1] if query_pos is None else query_pos
        if dest not in self.query_positions:
            raise ValueError(
                f"destination {dest} was not computed; available: {self.query_positions}"
            )
        i = self.query_positions.index(dest)
        norms = self.contributions[batch, :, i].norm(dim=-1)  # [head key_pos]
        weights = self.pattern[batch, :, i]
        order = norms.flatten().argsort(descending=True)[:k].tolist()
        n_src = norms.shape[1]
        rows = tuple(
            (
                head_label(self.layer, j // n_src),
                j % n_src,
                float(weights.flatten()[j]),
                float(norms.flatten()[j]),
            )
            for j in order
        )
        title = f"top {k} writes into pos {dest} (batch {batch}) by layer {self.layer} heads"
        return Table(("head", "src", "attention", "norm"), rows, title)

    def __repr__(self) -> str:
        batch, heads, _, n_src, d_model = self.contributions.shape
        return (
            f"SourceContributions(layer {self.layer}, {heads} heads, destinations "
            f"{list(self.query_positions)}, {n_src} sources, batch={batch}, d_model={d_model})"
        )


def head_source_contributions(
    model: HookedTransformer,
    cache: ActivationCache,
    layer: int,
    query_pos: int | Sequence[int] | None = None,
    *,
    max_elements: int = 2**28,
) -> SourceContributions:
    """Per head, per source position: what one layer moved into the destination(s).

    `query_pos` is one destination, a list of them, or None for all (a
    `[batch head query_pos key_pos d_model]` tensor, refused beyond `max_elements`).
    Needs `hook_pattern` and either `hook_v` or `hook_resid_pre` of the layer.
    """
    layer = _layer(model, layer)
    pattern = activation(cache, ("pattern", layer))
    v = head_values(model, cache, layer)
    n_query, n_key = pattern.shape[-2:]
    if v.shape[1] != n_key:
        raise ValueError(
            f"the pattern of layer {layer} has {n_key} key positions but the values have "
            f"{v.shape[1]} (a cache made with pos_slice or a KV cache cannot be decomposed)"
        )
    positions = _positions(query_pos, n_query)
    pattern = pattern[:, :, list(positions)]
    size = pattern.numel() * model.cfg.d_model
    if size > max_elements:
        raise ValueError(
            f"{size:,} elements (batch × head × query_pos × key_pos × d_model) exceed "
            f"max_elements={max_elements:,}; ask for fewer destinations with query_pos="
        )
    W_O = weight(model.layer_weight(layer, "attn", "W_O"), v)
    if model.cfg.attn_gate is None:
        written = einsum(
            v, W_O, "batch key_pos head d_head, head d_head d_model -> batch head key_pos d_model"
        )
        written = rearrange(written, "batch head k d_model -> batch head 1 k d_model")
    else:  # the query's gate scales each value it reads, dimension by dimension
        gate = activation(cache, f"blocks.{layer}.attn.hook_attn_gate")[:, list(positions)]
        gate = gate.expand(*gate.shape[:-1], v.shape[-1])  # one factor per head: widened
        written = einsum(
            v, gate.to(v.dtype), W_O,
            "batch k head d_head, batch q head d_head, head d_head d_model "
            "-> batch head q k d_model",
        )  # fmt: skip
    contributions = rearrange(pattern, "batch head q k -> batch head q k 1") * written
    contributions = _through_post_norm(model, cache, layer, contributions, positions)
    return SourceContributions(contributions, pattern, layer, positions)


def _through_post_norm(
    model: HookedTransformer,
    cache: ActivationCache,
    layer: int,
    contributions: Float[Tensor, "batch head query_pos key_pos d_model"],
    positions: tuple[int, ...],
) -> Float[Tensor, "batch head query_pos key_pos d_model"]:
    """Each (head, source) term through `ln1_post` at its destination's cached divisor."""
    norm = NormSite("ln1_post", layer)
    if not hasattr(norm.module(model), "hook_scale"):
        return contributions
    flat = rearrange(contributions, "batch head q k d_model -> (head k) batch q d_model")
    labels = tuple(str(i) for i in range(flat.shape[0]))
    flat, _ = through_norm(model, cache, norm, flat, labels, positions=positions)
    return rearrange(
        flat[: contributions.shape[1] * contributions.shape[3]],
        "(head k) batch q d_model -> batch head q k d_model",
        head=contributions.shape[1],
    )


def _positions(query_pos: int | Sequence[int] | None, n: int) -> tuple[int, ...]:
    if query_pos is None:
        return tuple(range(n))
    chosen = [query_pos] if isinstance(query_pos, int) else list(query_pos)
    for p in chosen:
        if not isinstance(p, int) or isinstance(p, bool) or not -n <= p < n:
            raise ValueError(f"query_pos {p!r} is out of range for {n} positions")
    return tuple(p % n for p in chosen)
