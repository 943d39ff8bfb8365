"""A chunk of an attribution graph's rows: every edge into a batch of targets, from one
sweep of the transposed maps down from them (`_frozen.sweep`), and what the sweeps read.

`attribution_graph` fills a dense `[node node]` matrix with these rows; `streaming` keeps
of them only what pruning needs. Both read the same rows, so the two agree edge for edge.
"""

import dataclasses
from typing import Any

import torch
from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor

from analysis.attribution_graphs import _frozen, _patterns
from hookedattn.sae import TranscoderSet

# The most elements of gathered gradients `[target source d_model]` a chunk holds at once
# unless told (64 MiB in float64).
GATHER_ELEMENTS = 2**23


@dataclasses.dataclass(frozen=True)
class Context:
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
    g: Context, chunk: Int[Tensor, " target"], n_nodes: int, gather_elements: int = GATHER_ELEMENTS
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
    return _rows(g, f, _frozen.sweep(f, seed, layer), own, n_nodes, gather_elements)


def logit_rows(
    g: Context, chosen: Int[Tensor, " target"], n_nodes: int, gather_elements: int = GATHER_ELEMENTS
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
    return _rows(g, f, _frozen.sweep(f, seed, None), own, n_nodes, gather_elements)


def _rows(
    g: Context,
    f: _frozen.Frozen,
    s: _frozen.Sweep,
    own: Float[Tensor, " target"],
    n_nodes: int,
    gather_elements: int,
) -> tuple[Float[Tensor, "target node"], Float[Tensor, " target"]]:
    """Every edge into the targets of sweep `s` (and their bias); `f` is the frozen forward
    on the prompt's first `m` positions, those the sweep ran on (sources after them are 0).
    The gradients gathered at the feature sources are `[target source d_model]`: at most
    `gather_elements` of them at once."""
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
        for block in columns.split(max(1, gather_elements // (len(own) * f.embed.shape[-1]))):
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


@dataclasses.dataclass(frozen=True)
class Prepared:
    """One prompt made ready for sweeps: the context, the target logits and the next-token
    probabilities, the transcoders and the prompt's tokens."""

    g: Context
    targets: Int[Tensor, " logit"]
    probabilities: Float[Tensor, " d_vocab_out"]
    tset: TranscoderSet
    tokens: Int[Tensor, " pos"]
    dropped_first_position: bool

    @property
    def n_nodes(self) -> int:
        """All nodes: features, error nodes, tokens, logits."""
        return self.g.n_nodes_before_logits + len(self.targets)


def prepare(
    model: Any,
    transcoders: Any,
    prompt: Any,
    logits: Any,
    top_k: int,
    demean_logits: bool,
    drop_first_position: bool,
    pattern_bytes: int = _patterns.PATTERN_BYTES,
) -> Prepared:
    """Check the model and the arguments, run the frozen forward (its pattern rows made in
    blocks of at most `pattern_bytes`) and find the nodes."""
    for name, flag in (("demean_logits", demean_logits),
                       ("drop_first_position", drop_first_position)):  # fmt: skip
        if not isinstance(flag, bool):
            raise ValueError(f"{name} must be True or False, got {flag!r}")
    tset = TranscoderSet(transcoders)
    _frozen.check_model(model, tset)
    tokens = _frozen.prompt_tokens(model, prompt)
    f = _frozen.freeze(model, tset, tokens, pattern_bytes)
    probabilities = f.logits[-1].softmax(-1)
    targets = _targets(logits, top_k, probabilities)
    first = 1 if drop_first_position else 0
    features, acts = _active(f, first)
    errors, dropped = _dropped(f, first)
    g = Context(f, features, acts, errors, dropped, demean_logits)
    return Prepared(g, targets, probabilities, tset, tokens, drop_first_position)


def header(model: Any, prompt: Any, p: Prepared, scan: str | None) -> dict[str, Any]:
    """What every graph of the prompt records besides its edges: the prompt and its tokens,
    the feature nodes, the target logits, the transcoders (`scan` their name, by default
    `{model_name}/{kind}-{d_sae}`) and the conventions followed."""
    tokens, targets, tset = p.tokens, p.targets, p.tset
    return dict(
        prompt=prompt if isinstance(prompt, str) else _frozen.prompt_text(model, tokens),
        tokens=tokens, token_strings=tuple(_frozen.token_texts(model, tokens.tolist())),
        n_layers=p.g.f.n_layers, features=p.g.features, activations=p.g.acts,
        logit_tokens=targets, logit_strings=tuple(_frozen.token_texts(model, targets.tolist())),
        logit_probabilities=p.probabilities[targets], transcoders=repr(tset),
        scan=_scan(model, tset) if scan is None else _checked_scan(scan),
        demeaned_logits=p.g.demean_logits, dropped_first_position=p.dropped_first_position,
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


def _dot(constant: Tensor | float, directions: Float[Tensor, "target d"]) -> Tensor | float:
    return directions @ constant if isinstance(constant, Tensor) else 0.0
