"""Attribution graphs: one prediction explained through transcoder features, exactly.

    graph = attribution_graph(model, transcoders, "def f(x):\\n    return f(", top_k=3)
    graph.adjacency[t, s]          # the direct effect of node s on node t

The nodes, in order (circuit-tracer's): every active feature `(layer, pos, feature)`, one
error node per `(layer, pos)` (what the transcoder misses of that MLP output), one input
token per position, and the target logits at the last position. `adjacency[t, s]` is the
direct linear effect of source `s` on target `t` with the attention patterns, norm scales
and error terms frozen at this prompt's forward (`_frozen`): `s`'s write carried by the
frozen linear map to what `t` reads, a feature's pre-activation or a logit. No other node
is on the path (a feature reached through another has its own edge); attention and the
skip terms are part of the map, not nodes. The replacement model with error terms is the
model's own forward, and with those things frozen it is affine in what the nodes write:

    Σ_s adjacency[t, s] + bias[t] = pre-activation of t   (or the logit, before any soft cap)

to rounding, `bias[t]` the "frozen bias terms" on the way (norm biases, `b_V`, `b_O`,
`b_dec`, `b_enc` or `b_U`); the tests check it in float64 to 1e-10. An edge is linear in
its source's value (a feature's activation, a token's embedding, an error node's vector),
so `total_effects`, which follows a change through the active features downstream, is the
first-order change of each logit when a node is scaled by `1 + ε`. Pruning, export and
interventions: the package's other modules; the guide: `docs/guide/transcoders.md`.

Two conventions of circuit-tracer's `attribute` are options (`demean_logits`,
`drop_first_position`), off by default:

- circuit-tracer's logit targets are each logit less the mean logit (the unembedding
  column less the mean column, the direction that moves the softmax); ours are the logits
  the model returns. `demean_logits=True` makes the targets its, and the identity above
  holds with `logit - mean(logits)`.
- circuit-tracer prepends a BOS and leaves position 0 out: no features there, zero error
  vectors there. `drop_first_position=True` does the same; what those features and errors
  write is then a frozen constant, counted in `bias` (the identity holds).

They are off by default because the graph then accounts for the model's own output, every
position included: our prompts start with a BOS only where the model's tokenizer adds one,
so position 0 may be a word of the prompt, and a dropped node's effect would otherwise go
unseen.
"""

import dataclasses
import os
from collections.abc import Sequence
from typing import Any

import torch
from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor

from analysis.attribution_graphs import _frozen
from hookedattn.sae import TranscoderSet


@dataclasses.dataclass(frozen=True, repr=False)
class AttributionGraph:
    """The graph of one prompt's prediction (module docstring).

    `features: [feature 3]` holds `(layer, pos, index)` of each active feature, in node
    order, `activations` their values; `logit_tokens` the target tokens (at the last
    position), `logit_strings` them as text and `logit_probabilities` their probabilities.
    `adjacency: [node node]` is targets by sources; `bias: [node]` the frozen bias terms of
    each target (zero for nodes that are only sources). `backward_batches` counts the
    transposed sweeps run. `scan` names the transcoders in the graph JSON; `demeaned_logits`
    and `dropped_first_position` say which of circuit-tracer's conventions it follows
    (module docstring).
    """

    prompt: str
    tokens: Int[Tensor, " pos"]
    token_strings: tuple[str, ...]
    n_layers: int
    features: Int[Tensor, "feature 3"]
    activations: Float[Tensor, " feature"]
    logit_tokens: Int[Tensor, " logit"]
    logit_strings: tuple[str, ...]
    logit_probabilities: Float[Tensor, " logit"]
    adjacency: Float[Tensor, "node node"]
    bias: Float[Tensor, " node"]
    backward_batches: int
    transcoders: str
    scan: str = ""
    demeaned_logits: bool = False
    dropped_first_position: bool = False

    # ------------------------------------------------------------------ the node order
    @property
    def n_pos(self) -> int:
        """Positions in the prompt."""
        return len(self.tokens)

    @property
    def n_features(self) -> int:
        """Active feature nodes."""
        return len(self.features)

    @property
    def n_nodes(self) -> int:
        """All nodes: features, error nodes, tokens, logits."""
        return self.adjacency.shape[0]

    def error_node(self, layer: int, pos: int) -> int:
        """The index of the error node of layer `layer` at position `pos`."""
        return self.n_features + layer * self.n_pos + pos

    def token_node(self, pos: int) -> int:
        """The index of the input token at position `pos`."""
        return self.n_features + self.n_layers * self.n_pos + pos

    def logit_node(self, i: int) -> int:
        """The index of the `i`-th target logit (`logit_tokens[i]`)."""
        return self.n_features + (self.n_layers + 1) * self.n_pos + i

    def feature_node(self, layer: int, pos: int, feature: int) -> int:
        """The index of the active feature `feature` of layer `layer` at position `pos`; a
        `KeyError` when it is not active there."""
        wanted = torch.tensor([layer, pos, feature], device=self.features.device)
        match = (self.features == wanted).all(-1).nonzero()
        if len(match) == 0:
            raise KeyError(f"feature {feature} of layer {layer} is not active at position {pos}")
        return int(match[0, 0])

    def label(self, node: int) -> str:
        """A short name for a node: `L1.F42@7`, `L0.error@3`, `tok 'a'@2`, `logit 'b'`."""
        if node < self.n_features:
            layer, pos, feature = self.features[node].tolist()
            return f"L{layer}.F{feature}@{pos}"
        node -= self.n_features
        if node < self.n_layers * self.n_pos:
            return f"L{node // self.n_pos}.error@{node % self.n_pos}"
        node -= self.n_layers * self.n_pos
        if node < self.n_pos:
            return f"tok {self.token_strings[node]!r}@{node}"
        i = node - self.n_pos
        return f"logit {self.logit_strings[i]!r}"

    # ------------------------------------------------------------------ what it predicts
    def total_effects(self) -> Float[Tensor, "logit node"]:
        """`[i, s]`: the first-order change of target logit `i` per unit `ε` when node `s`
        is scaled by `1 + ε`, through every path of the graph (each active feature passing
        a change of its pre-activation on to its activation one to one)."""
        A, n_f = self.adjacency, self.n_features
        rows = [self.logit_node(i) for i in range(len(self.logit_tokens))]
        current = A[rows]
        total = current.clone()
        for _ in range(self.n_layers):
            current = (current[:, :n_f] / self.activations) @ A[:n_f]
            total = total + current
        return total

    def __repr__(self) -> str:
        logits = ", ".join(repr(s) for s in self.logit_strings)
        return (
            f"AttributionGraph({self.prompt!r}: {self.n_features} features, "
            f"{self.n_layers * self.n_pos} error nodes, {self.n_pos} tokens, logits {logits}; "
            f"{int((self.adjacency != 0).sum()):,} edges)"
        )


@torch.no_grad()
def attribution_graph(
    model: Any,
    transcoders: Any,
    prompt: Any,
    *,
    logits: int | Sequence[int] | None = None,
    top_k: int = 5,
    batch_size: int = 64,
    demean_logits: bool = False,
    drop_first_position: bool = False,
    scan: str | None = None,
    max_bytes: int | None = None,
) -> AttributionGraph:
    """The attribution graph of `model`'s prediction after `prompt` (text, or token ids
    `[pos]`), with its MLPs replaced by `transcoders` (a list of per-layer ones, or a
    `CrossLayerTranscoder`; every layer replaced).

    The target logits are `logits` (token ids) or the `top_k` most probable next tokens.
    Targets are swept down `batch_size` at a time (`backward_batches` counts the sweeps).
    `demean_logits` and `drop_first_position` take circuit-tracer's conventions (module
    docstring; both off by default, as said there). `scan` is circuit-tracer's name for the
    transcoders (Neuronpedia's, e.g. `"gemma-2-2b"`), which the graph JSON carries; by
    default `{model_name}/{kind}-{d_sae}`.

    The graph is a dense `[node node]` matrix: one refused up front, with its size, when it
    would take more than `max_bytes` (default: half the memory free on its device now).
    """
    _frozen.refuse_sharded(model)
    _check_flags(demean_logits=demean_logits, drop_first_position=drop_first_position)
    tset = TranscoderSet(transcoders)
    _frozen.check_model(model, tset)
    tokens = _frozen.prompt_tokens(model, prompt)
    f = _frozen.freeze(model, tset, tokens)
    probabilities = f.logits[-1].softmax(-1)
    targets = _targets(logits, top_k, probabilities)
    first = 1 if drop_first_position else 0
    features, acts = _active(f, first)
    n_f, n_pos, n = len(features), len(tokens), f.n_layers
    n_nodes = n_f + (n + 1) * n_pos + len(targets)
    _check_size(n_nodes, f.embed, max_bytes)
    errors, dropped = _dropped(f, first)
    g = _Context(f, features, acts, errors, dropped, demean_logits)
    adjacency, bias = f.embed.new_zeros(n_nodes, n_nodes), f.embed.new_zeros(n_nodes)
    batches = _fill(g, adjacency, bias, targets, batch_size)
    token_strings = tuple(_frozen.token_texts(model, tokens.tolist()))
    return AttributionGraph(
        prompt=prompt if isinstance(prompt, str) else _frozen.prompt_text(model, tokens),
        tokens=tokens, token_strings=token_strings, n_layers=n,
        features=features, activations=acts, logit_tokens=targets,
        logit_strings=tuple(_frozen.token_texts(model, targets.tolist())),
        logit_probabilities=probabilities[targets], adjacency=adjacency, bias=bias,
        backward_batches=batches, transcoders=repr(tset),
        scan=_scan(model, tset) if scan is None else _checked_scan(scan),
        demeaned_logits=demean_logits, dropped_first_position=drop_first_position,
    )  # fmt: skip


def _scan(model: Any, tset: TranscoderSet) -> str:
    """`{model_name}/{kind}-{d_sae}`: the default name of the transcoders in the JSON."""
    kind = "clt" if tset.kind == "cross_layer" else "plt"  # circuit-tracer's CLT / PLT
    name = getattr(model.cfg, "model_name", "") or "model"
    return f"{name}/{kind}-{tset.d_sae(tset.layers[0])}"


def _checked_scan(scan: Any) -> str:
    if not isinstance(scan, str) or not scan:
        raise ValueError(f"scan must be a non-empty str (the transcoders' name), got {scan!r}")
    return scan


def _targets(logits: Any, top_k: int, probabilities: Tensor) -> Int[Tensor, " logit"]:
    if logits is None:
        if not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1:
            raise ValueError(f"top_k must be a positive int, got {top_k!r}")
        return probabilities.topk(min(top_k, len(probabilities))).indices
    targets = torch.as_tensor([logits] if isinstance(logits, int) else list(logits))
    n = len(probabilities)
    if (
        targets.numel() == 0
        or targets.dtype.is_floating_point
        or not bool(((targets >= 0) & (targets < n)).all())
    ):
        raise ValueError(f"logits must be token ids in 0..{n - 1}, got {logits!r}")
    return targets


def _active(
    f: _frozen.Frozen, first: int
) -> tuple[Int[Tensor, "feature 3"], Float[Tensor, " feature"]]:
    """Every `(layer, pos, feature)` with a nonzero activation at positions `first..`, in
    that order, and its value."""
    found, values = [], []
    for layer, acts in enumerate(f.acts):
        pos, feature = acts.nonzero(as_tuple=True)
        pos, feature = pos[pos >= first], feature[pos >= first]
        found.append(torch.stack([torch.full_like(pos, layer), pos, feature], -1))
        values.append(acts[pos, feature])
    return torch.cat(found), torch.cat(values)


def _dropped(
    f: _frozen.Frozen, first: int
) -> tuple[tuple[Float[Tensor, "pos d_model"], ...], tuple[Float[Tensor, "pos d_model"], ...]]:
    """The error nodes' vectors, zero at positions before `first`, and what each layer's
    features and error write there (the rest zero): constants, not nodes."""
    if first == 0:
        return f.errors, tuple(torch.zeros_like(e) for e in f.errors)
    errors, dropped = [], []
    for layer, error in enumerate(f.errors):
        written = error.clone()
        for source in f.tset.sources(layer):
            W = f.tset.decoder(source, layer).detach()
            written = written + einsum(f.acts[source], W, "p s, s d -> p d")
        written[first:] = 0
        kept = error.clone()
        kept[:first] = 0
        errors.append(kept)
        dropped.append(written)
    return tuple(errors), tuple(dropped)


def _fill(
    g: "_Context", adjacency: Tensor, bias: Tensor, targets: Int[Tensor, " logit"], batch_size: int
) -> int:
    """Every row of the graph: the feature targets layer by layer, then the logits,
    `batch_size` targets a sweep; returns how many sweeps."""
    batches, n_nodes = 0, len(adjacency)
    for layer in range(g.f.n_layers):
        for chunk in (g.features[:, 0] == layer).nonzero().flatten().split(batch_size):
            adjacency[chunk], bias[chunk] = feature_rows(g, chunk, n_nodes)
            batches += 1
    first_logit = g.n_nodes_before_logits
    logit_rows_ = torch.arange(first_logit, first_logit + len(targets), device=targets.device)
    for chosen, rows in zip(targets.split(batch_size), logit_rows_.split(batch_size), strict=True):
        adjacency[rows], bias[rows] = logit_rows(g, chosen, n_nodes)
        batches += 1
    return batches


def _check_flags(**flags: Any) -> None:
    """Each of `flags` is True or False."""
    for name, flag in flags.items():
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be True or False, got {flag!r}")


def _check_size(n_nodes: int, like: Tensor, max_bytes: int | None) -> None:
    """Refuse a graph whose adjacency would take more than `max_bytes` (default: half the
    free memory of `like`'s device, where it can be read)."""
    if max_bytes is not None and (isinstance(max_bytes, bool) or not isinstance(max_bytes, int)
                                  or max_bytes < 1):  # fmt: skip
        raise ValueError(f"max_bytes must be a positive int (bytes) or None, got {max_bytes!r}")
    budget = _free_memory(like.device) // 2 if max_bytes is None else max_bytes
    needed = n_nodes * n_nodes * like.element_size()
    if budget is not None and needed > budget:
        source = "max_bytes" if max_bytes is not None else "half the free memory"
        raise ValueError(
            f"this attribution graph has {n_nodes:,} nodes: its adjacency [{n_nodes} "
            f"{n_nodes}] in {like.dtype} would take {needed / 2**30:.2f} GiB, more than "
            f"{budget / 2**30:.2f} GiB ({source}); use a shorter prompt, fewer active "
            f"features (transcoders with a higher threshold) or fewer target logits, or "
            f"pass a larger max_bytes"
        )


def _free_memory(device: torch.device) -> int | None:
    """The bytes free on `device` now (None where this cannot be read)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


@dataclasses.dataclass(frozen=True)
class _Context:
    """What filling a graph's rows reads: the frozen forward, the feature nodes, the error
    nodes' vectors and the writes left out of the nodes (`_dropped`), and whether the
    logits are demeaned."""

    f: _frozen.Frozen
    features: Int[Tensor, "feature 3"]
    acts: Float[Tensor, " feature"]
    errors: tuple[Float[Tensor, "pos d_model"], ...]
    dropped: tuple[Float[Tensor, "pos d_model"], ...]
    demean_logits: bool

    @property
    def n_nodes_before_logits(self) -> int:
        """Features, error nodes and tokens: the index of the first logit node."""
        return len(self.features) + (self.f.n_layers + 1) * len(self.f.tokens)


def feature_rows(
    g: _Context, chunk: Int[Tensor, " target"], n_nodes: int
) -> tuple[Float[Tensor, "target node"], Float[Tensor, " target"]]:
    """The rows `[target node]` of feature targets `chunk` (all of one layer) and their
    bias, from one sweep. The sweep runs on the prompt up to the chunk's last position:
    attention is causal, so nothing after it reaches these targets."""
    layer = int(g.features[chunk[0], 0])
    pos, index = g.features[chunk, 1], g.features[chunk, 2]
    f = _frozen.prefix(g.f, int(pos.max()) + 1)
    W_enc, b_enc = f.tset.encoder(layer)
    directions = W_enc.detach()[:, index].T  # target d_in
    seed = f.embed.new_zeros(len(chunk), len(f.tokens), f.embed.shape[-1])
    seed[torch.arange(len(chunk), device=seed.device), pos] = directions
    seed = _frozen.input_transpose(f, layer, seed)
    own = b_enc.detach()[index] + _dot(_frozen.input_constant(f, layer), directions)
    return _rows(g, f, _frozen.sweep(f, seed, layer), own, n_nodes)


def logit_rows(
    g: _Context, chosen: Int[Tensor, " target"], n_nodes: int
) -> tuple[Float[Tensor, "target node"], Float[Tensor, " target"]]:
    """The rows `[target node]` of the logit targets `chosen` (token ids) and their bias,
    from one sweep."""
    f = g.f
    directions, b_U = f.W_U[:, chosen].T, f.b_U[chosen]  # target d_model, target
    if g.demean_logits:  # circuit-tracer's target: the logit less the mean logit
        directions, b_U = directions - f.W_U.mean(-1), b_U - f.b_U.mean()
    seed = f.embed.new_zeros(len(chosen), len(f.tokens), f.embed.shape[-1])
    last = None if f.scale_final is None else f.scale_final[-1:]
    seed[:, -1] = _frozen.norm_transpose(f.ln_final, directions[:, None], last)[:, 0]
    own = b_U + _dot(_frozen.norm_bias(f.ln_final), directions)
    return _rows(g, f, _frozen.sweep(f, seed, None), own, n_nodes)


def _rows(
    g: _Context, f: _frozen.Frozen, s: _frozen.Sweep, own: Float[Tensor, " target"], n_nodes: int
) -> tuple[Float[Tensor, "target node"], Float[Tensor, " target"]]:
    """Every edge into the targets of sweep `s` (and their bias); `f` is the frozen forward
    on the prompt's first `m` positions, those the sweep ran on (sources after them are 0)."""
    features, m = g.features, len(f.tokens)
    n_f, n_pos = len(features), len(g.f.tokens)
    A = f.embed.new_zeros(len(own), n_nodes)
    for layer, grad in s.post.items():
        start = n_f + layer * n_pos
        A[:, start : start + m] = einsum(grad, g.errors[layer][:m], "t p d, p d -> t p")
    token_start = n_f + f.n_layers * n_pos
    A[:, token_start : token_start + m] = einsum(s.embed, f.embed, "t p d, p d -> t p")
    for source in range(f.n_layers):
        columns = ((features[:, 0] == source) & (features[:, 1] < m)).nonzero().flatten()
        written = [o for o in f.tset.outputs(source) if o in s.post]
        if len(columns) == 0 or not written:
            continue
        # in blocks of sources: the gathered gradients are `[target source d_model]`
        for block in columns.split(max(1, _GATHER_ELEMENTS // (len(own) * f.embed.shape[-1]))):
            pos, index = features[block, 1], features[block, 2]
            edge = 0
            for out in written:
                W = f.tset.decoder(source, out).detach()[index]  # source d_out
                edge = edge + einsum(s.post[out][:, pos], W, "t s d, s d -> t s")
            A[:, block] = edge * g.acts[block]
    constant = own.clone()
    for layer, grad in s.mid.items():
        constant = constant + einsum(grad, _frozen.attention_constant(f, layer), "t p d, p d -> t")
    for layer, grad in s.post.items():
        constant = constant + einsum(grad, _frozen.mlp_constant(f, layer), "t p d, d -> t")
        constant = constant + einsum(grad, g.dropped[layer][:m], "t p d, p d -> t")
    return A, constant


# The most elements of gathered gradients `_rows` holds at once (64 MiB in float64).
_GATHER_ELEMENTS = 2**23


def _dot(constant: Tensor | float, directions: Float[Tensor, "target d"]) -> Tensor | float:
    return directions @ constant if isinstance(constant, Tensor) else 0.0
