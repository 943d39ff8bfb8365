"""The residual stream as a sum of what every earlier part of the model wrote into it.

    resid_pre[L] = embed + pos_embed + Σ_{l<L} (attn_out[l] + mlp_out[l])
    attn_out[l]  = Σ_h result_{l,h} + b_O[l]
    mlp_out[l]   = Σ_n post_{l,n} · W_out[l][n] + b_out[l]

`decompose_resid` returns those terms at the granularity asked for, labelled, so that
they add up to the cached stream (to float rounding: `check=True` verifies it);
`accumulated_resid` returns the stream itself at each point up to one.

With a sparse autoencoder spliced at an earlier (or the same) residual point, the
`"features"` granularity writes the stream there as the SAE's terms instead (each active
feature's `acts_f · W_dec[f]`, `sae_b_dec`, and `sae_error`, what the splice added beyond
the reconstruction; `analysis._sae_terms`), followed by the sublayers after it:

    resid[P] = Σ_f acts_f W_dec[f] + b_dec + error + Σ_{sublayers between the SAE and P}

On every block shape the sum is exact:

- sequential blocks add `attn_out` at `resid_mid` and `mlp_out` at `resid_post`; a parallel
  block (`parallel_attn_mlp`: GPT-NeoX) has no `resid_mid` (it is refused), and adds both
  at `resid_post`; an attention-only block has no MLP terms.
- a gated MLP's neurons write `post_n · W_out[n]` with `post = act(x W_gate) * (x W_in +
  b_in)` (`hook_post`), as a plain MLP's do.
- a mixture of experts writes `Σ_e g_e · out_e` over each token's chosen experts, plus a
  shared expert's output where there is one (`analysis.experts`): at `"expert"`
  granularity each expert is a term, zero at the tokens that did not choose it.
- norms of the stream itself (post-residual norms, `ln_resid_mid`/`ln_resid_post`: GPT-1,
  BERT, BART; a norm of the embeddings, `ln_embed`) rescale everything written before them:
  at granularity `"sublayer"` (the only one there) each earlier term is passed through
  each such norm at the scale the forward recorded (centred, divided, times the gain) and
  the norm's bias is a term of its own (`L0_ln_resid_mid_bias`), so the terms sum to the
  stream exactly; each is its write's share of this forward's stream, as below.
- a norm after a sublayer (`ln1_post`, `ln2_post`: Gemma 2, OLMo 2) is part of what the
  sublayer writes: `L0_attn` is `hook_attn_out`, after that norm. Its divisor depends on all
  of the sublayer's heads or neurons together, so per head or per neuron the sublayer is
  not linear; with the divisor fixed at the value the forward recorded it is, and each
  head's and neuron's term is passed through the norm that way (`head_writes`): the terms
  still add up to the stream exactly, but each is the head's share of this forward's
  output, not what the head would write alone. `L0_attn_bias` is then `b_O` through the
  norm, and a LayerNorm's own bias is one more term (`L0_ln1_post_bias`).
- a block's third sublayer reading its per-layer input (Gemma 4's small sizes) writes one
  term, `L0_per_layer` (`hook_per_layer_out`); a block that scales the stream it leaves by
  a learned number (Gemma 4's `resid_post_scale`: `resid_post = w (resid_mid + mlp_out +
  ...)`) scales every term written before it by `w`, so each term is what reaches the
  point through every later block's scalar.
"""

from collections.abc import Callable
from typing import NamedTuple

import torch
from einops import rearrange
from jaxtyping import Float
from torch import Tensor

from analysis._naming import expert_label, head_label, neuron_label
from analysis._reading import activation, weight
from analysis._resid_stack import AccumulatedResid, Decomposition, check_sums_to
from analysis._sae_terms import feature_terms, sae_point
from analysis._stream_terms import (
    block_extras,
    block_layout,
    normed_stream,
    sublayer_terms,
    through_stream_norms,
)
from analysis.experts import expert_writes, shared_write
from analysis.head_results import _results_into, _written_z, head_results
from analysis.normalization import NormSite, through_norm
from hookedattn.core.cache import ActivationCache
from hookedattn.core.components.norm import NoNorm
from hookedattn.core.model import HookedTransformer
from hookedattn.core.names import get_act_name
from hookedattn.sae import SparseAutoencoder

GRANULARITIES: tuple[str, ...] = ("sublayer", "head", "neuron", "expert", "features")
Terms = Float[Tensor, "component batch pos d_model"]


class _Part(NamedTuple):
    """Some of a decomposition's terms: their labels, and either the terms themselves or how
    to write them into their rows of the result (which is allocated once, so that no term
    is copied after it is made); or, with no labels, a block's scalar `scale` that
    multiplies every term before it (`resid_post_scale`)."""

    labels: tuple[str, ...]
    write: Callable[[Terms], None] | None = None
    terms: Terms | None = None
    scale: Tensor | None = None


def _given(labels: tuple[str, ...], terms: Terms) -> _Part:
    return _Part(labels, terms=terms)


def _bias(label: str, bias: Float[Tensor, " d_model"]) -> _Part:
    return _Part((label,), lambda out: out.copy_(weight(bias, out).expand_as(out)))


_Parts = list[_Part]


def _resolve_point(model: HookedTransformer, layer: int | None, site: str) -> tuple[str, int]:
    """`(site, layer)` of a residual-stream point, with the final stream as `resid_post`
    of the last block (`layer=None`, or `resid_pre` of `n_layers`, as in TransformerLens).
    """
    n_layers = model.cfg.n_layers
    if n_layers == 0:
        raise ValueError("a model with 0 layers has no residual stream hook points")
    if site not in ("resid_pre", "resid_mid", "resid_post"):
        raise ValueError(f"site must be 'resid_pre', 'resid_mid' or 'resid_post', got {site!r}")
    if layer is None or (site == "resid_pre" and layer == n_layers):
        if site == "resid_mid":
            raise ValueError("resid_mid lives inside a block: give its layer")
        return "resid_post", n_layers - 1
    if not isinstance(layer, int) or isinstance(layer, bool) or not -n_layers <= layer < n_layers:
        extra = f" (or {n_layers}, the final stream, for resid_pre)" if site == "resid_pre" else ""
        raise ValueError(f"layer must be an int in 0..{n_layers - 1}{extra}, got {layer!r}")
    if site == "resid_mid" and model.cfg.attn_only:
        raise ValueError("an attention-only model has no resid_mid: its blocks have no MLP")
    if site == "resid_mid" and model.cfg.parallel_attn_mlp:
        raise ValueError(
            "a parallel block (parallel_attn_mlp=True) has no resid_mid: its attention and "
            "MLP both read resid_pre, and both are added at resid_post"
        )
    return site, layer % n_layers


def _broadcast(
    bias: Float[Tensor, " d_model"], like: Float[Tensor, "batch pos d_model"]
) -> Float[Tensor, "1 batch pos d_model"]:
    return torch.broadcast_to(weight(bias, like), like.shape)[None]


def _attn_parts(
    model: HookedTransformer, cache: ActivationCache, layer: int, granularity: str
) -> _Parts:
    kind = model.cfg.layer_mixer(layer)
    if kind != "attention":  # a hybrid's mixer has no heads: its write as one term
        return [_given((f"L{layer}_{kind}",), activation(cache, ("attn_out", layer))[None])]
    attn = model.blocks[layer].attn
    # The heads W_O writes: differential attention's pairs of query heads.
    own = model.cfg.attention_config(layer)  # this block's heads (they may differ per block)
    n_written = own.n_heads // 2 if own.differential_attention else own.n_heads
    labels = tuple(head_label(layer, h) for h in range(n_written))
    bias_label = f"L{layer}_attn_bias"
    if _has_norm(model, "ln1_post", layer):
        results = head_results(model, cache, layer)
        heads = rearrange(results, "batch pos head d_model -> head batch pos d_model")
        terms = torch.cat([heads, _broadcast(attn.b_O, heads[0])])
        terms, labels = through_norm(
            model, cache, NormSite("ln1_post", layer), terms, (*labels, bias_label)
        )
        return [_given(labels, terms)]
    kind = _written_z(model)  # what W_O reads: z, or z behind a sub-norm
    if ("result", layer) in cache or (kind, layer) not in cache:
        # The cached results (or, with neither in the cache, head_results says what is missing).
        results = head_results(model, cache, layer)
        heads = rearrange(results, "batch pos head d_model -> head batch pos d_model")
        return [_given(labels, heads), _bias(bias_label, attn.b_O)]
    z = activation(cache, (kind, layer))

    def write(out: Terms) -> None:
        _results_into(out, z, weight(model.layer_weight(layer, "attn", "W_O"), z))

    return [_Part(labels, write), _bias(bias_label, attn.b_O)]


def _mlp_parts(
    model: HookedTransformer, cache: ActivationCache, layer: int, granularity: str
) -> _Parts:
    if granularity == "neuron" and model.cfg.is_moe:
        raise ValueError(
            "granularity='neuron' is for dense MLPs; this model's MLPs are mixtures of experts: "
            "use granularity='expert' (each expert's write, L0E3, ...)"
        )
    if granularity == "expert" and model.cfg.layer_is_moe(layer):
        return _expert_parts(model, cache, layer)
    if granularity != "neuron":
        return [_given((f"L{layer}_mlp",), activation(cache, ("mlp_out", layer))[None])]
    post = activation(cache, ("post", layer))  # a gated MLP's too: act(gate) * linear
    mlp = model.blocks[layer].mlp
    labels = tuple(neuron_label(layer, n) for n in range(post.shape[-1]))
    bias_label = f"L{layer}_mlp_bias"
    if _has_norm(model, "ln2_post", layer):
        neurons = _neuron_writes(post, weight(model.layer_weight(layer, "mlp", "W_out"), post))
        terms = torch.cat([neurons, _broadcast(mlp.b_out, neurons[0])])
        terms, labels = through_norm(
            model, cache, NormSite("ln2_post", layer), terms, (*labels, bias_label)
        )
        return [_given(labels, terms)]

    def write(out: Terms) -> None:
        W_out = weight(model.layer_weight(layer, "mlp", "W_out"), post)
        torch.mul(_by_neuron(post), W_out[:, None, None, :], out=out)

    return [_Part(labels, write), _bias(bias_label, mlp.b_out)]


def _by_neuron(post: Float[Tensor, "batch pos d_mlp"]) -> Float[Tensor, "d_mlp batch pos 1"]:
    return rearrange(post, "batch pos d_mlp -> d_mlp batch pos 1")


def _neuron_writes(
    post: Float[Tensor, "batch pos d_mlp"], W_out: Float[Tensor, "d_mlp d_model"]
) -> Float[Tensor, "d_mlp batch pos d_model"]:
    """Each neuron's write `post_n · W_out[n]`."""
    return _by_neuron(post) * W_out[:, None, None, :]


def _has_norm(model: HookedTransformer, site: str, layer: int) -> bool:
    """Whether block `layer` has a real norm at `site` (a post norm: `ln1_post`, `ln2_post`)."""
    return not isinstance(NormSite(site, layer).module(model), NoNorm)


def _expert_parts(model: HookedTransformer, cache: ActivationCache, layer: int) -> _Parts:
    """Each expert's write (zero where it was not chosen), the shared expert's, through the
    norm after the MLP at its recorded divisor."""
    terms = expert_writes(model, cache, layer)
    labels = tuple(expert_label(layer, e) for e in range(terms.shape[0]))
    shared = shared_write(model, cache, layer)
    if shared is not None:
        terms = torch.cat([terms, shared[None].to(terms.dtype)])
        labels = (*labels, f"L{layer}_shared_expert")
    terms, labels = through_norm(model, cache, NormSite("ln2_post", layer), terms, labels)
    return [_given(labels, terms)]


def decompose_resid(
    model: HookedTransformer,
    cache: ActivationCache,
    layer: int | None = None,
    site: str = "resid_pre",
    granularity: str = "sublayer",
    *,
    check: bool = False,
    sae: SparseAutoencoder | None = None,
) -> Decomposition:
    """The residual stream at one point as the labelled sum of what wrote into it.

    The point is `(site, layer)`: `resid_pre` of block `layer` (the default; `layer =
    n_layers` is the final stream), `resid_mid` or `resid_post` of it; `layer=None` is the
    final stream, the one `ln_final` reads. `granularity`:

    - `"sublayer"`: `embed`, `pos_embed`, `L0_attn`, `L0_mlp`, ... (the cached
      `attn_out`/`mlp_out`, biases included; a hybrid's mixer in attention's place is
      labelled by its kind, `L0_mamba2`, as at every granularity);
    - `"head"`: each head `L0H0`, ... and the output bias `L0_attn_bias` apart (in a
      hybrid model, a block with a mixer in attention's place has no heads: its whole
      write, `hook_attn_out`, is one term labelled by its kind, `L0_mamba2`; a mixer
      beside the attention, Falcon-H1's, is one term more, `hook_mixer_out`, labelled so; a
      Nemotron-H block of one sublayer has only that sublayer's terms);
    - `"neuron"`: heads as above, and each neuron `L0N0`, ... with `L0_mlp_bias` apart;
    - `"expert"`: heads as above, and, in a mixture of experts, each expert's write
      `L0E0`, ... (zero where a token did not choose it; its biases inside it) and the
      shared expert's `L0_shared_expert` (dense MLPs stay whole, `L0_mlp`);
    - `"features"`, with `sae` (spliced when the cache was recorded, at this point or an
      earlier one): each feature active in the batch `F12`, ..., `sae_b_dec` and
      `sae_error` at the SAE's point, then the later sublayers as with `"sublayer"`.

    `pos_embed` is there for models with learned positions only. On each block shape
    (parallel, gated, norms after the sublayers) see the module docstring: the terms are
    exact everywhere; behind a norm after a sublayer, a head's or neuron's term is its
    share at the divisor the forward recorded. With `check=True` the
    sum is compared with the cached stream, and a `DecompositionError` names the largest
    error if it is beyond the dtype's rounding.
    """
    _check_granularity(model, granularity, sae)
    site, layer = _resolve_point(model, layer, site)
    components, labels = _terms(model, cache, site, layer, granularity, sae)
    if check:
        target = activation(cache, get_act_name(site, layer))
        check_sums_to(
            components, target, f"the decomposition of {get_act_name(site, layer)}", model.cfg.dtype
        )
    return Decomposition(components, labels, site, layer)


def _check_granularity(
    model: HookedTransformer, granularity: str, sae: SparseAutoencoder | None
) -> None:
    """Refuse a granularity that is unknown, or that this model's stream cannot be split at."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if sae is not None and granularity != "features":
        raise ValueError(f"sae is for granularity='features', not {granularity!r}")
    if normed_stream(model.cfg) and block_extras(model.cfg):
        raise ValueError(
            "this model's stream passes norms of its own and its blocks scale it or write a "
            "per-layer term (resid_post_scale, d_per_layer_input): no model built has both, "
            "and decompose_resid does not split them together"
        )
    if normed_stream(model.cfg) and granularity != "sublayer":
        raise ValueError(
            f"granularity={granularity!r}: the stream of this model passes norms of its own "
            f"(post-residual norms, the skips of normed_skip, or a norm of the embeddings) "
            f"that rescale it, or its embeddings a projection into it, so only "
            f"granularity='sublayer' decomposes it "
            f"(through those norms at their recorded scales, and the projection)"
        )


def _terms(
    model: HookedTransformer,
    cache: ActivationCache,
    site: str,
    layer: int,
    granularity: str,
    sae: SparseAutoencoder | None,
) -> tuple[Terms, tuple[str, ...]]:
    """`decompose_resid`'s components and labels at `(site, layer)`."""
    if normed_stream(model.cfg):
        return through_stream_norms(model, cache, site, layer)
    if granularity == "sublayer" and not model.cfg.resid_post_scale:  # the cached streams
        terms = sublayer_terms(model, site, layer)
        components = torch.stack([activation(cache, name) for _, name in terms])
        return components, tuple(label for label, _ in terms)
    if granularity == "features":
        parts = _feature_parts(model, cache, site, layer, sae)
    else:
        parts = _parts(model, cache, site, layer, granularity)
    components = _assembled(parts, activation(cache, "embed"))
    return components, tuple(label for part in parts for label in part.labels)


def _assembled(parts: _Parts, like: Float[Tensor, "batch pos d_model"]) -> Terms:
    """The parts' terms in one tensor, allocated once and written part by part (one
    `torch.cat` when every part is given terms of `like`'s shape and dtype)."""
    if all(_fits(part.terms, like) for part in parts):
        return torch.cat([part.terms for part in parts])
    components = like.new_empty((sum(len(part.labels) for part in parts), *like.shape))
    start = 0
    for part in parts:
        stop = start + len(part.labels)
        if part.scale is not None:  # a block's scalar: every term before it, scaled
            components[:start] *= weight(part.scale, components)
        elif part.write is None:
            components[start:stop].copy_(part.terms)  # broadcast, or cast to like's dtype
        else:
            part.write(components[start:stop])
        start = stop
    return components


def _fits(terms: Terms | None, like: Float[Tensor, "batch pos d_model"]) -> bool:
    return terms is not None and terms.shape[1:] == like.shape and terms.dtype == like.dtype


def _parts(
    model: HookedTransformer, cache: ActivationCache, site: str, layer: int, granularity: str
) -> _Parts:
    """What wrote into the stream at `(site, layer)`, at a granularity of the model's own."""
    if granularity == "sublayer":
        return _sublayer_parts(model, cache, site, layer)
    parts: _Parts = [_given(("embed",), activation(cache, "embed")[None])]
    if model.cfg.positional_embedding_type == "standard":
        parts.append(_given(("pos_embed",), activation(cache, "pos_embed")[None]))
    n_whole = layer + 1 if site == "resid_post" else layer
    for block in range(n_whole):
        parts += _mixing_parts(model, cache, block, granularity)
        if model.cfg.layer_has_mlp(block):
            parts += _mlp_parts(model, cache, block, granularity)
        parts += _block_end_parts(model, cache, block)
    if site == "resid_mid":
        parts += _mixing_parts(model, cache, layer, granularity)
    return parts


def _sublayer_parts(
    model: HookedTransformer, cache: ActivationCache, site: str, layer: int
) -> _Parts:
    """The cached embeddings and sublayer outputs at `(site, layer)` as terms, each block's
    scalar (`resid_post_scale`) after that block's terms."""
    terms = sublayer_terms(model, site, layer)
    given = [_given((label,), activation(cache, name)[None]) for label, name in terms]
    if not model.cfg.resid_post_scale:
        return given
    parts: _Parts = []
    done = 0
    for block in range(layer + 1 if site == "resid_post" else layer):
        upto = len(sublayer_terms(model, "resid_post", block))  # the terms up to its end
        parts += [*given[done:upto], _Part((), scale=model.blocks[block].resid_scale.w)]
        done = upto
    return parts + given[done:]  # at resid_mid, the block's attention


def _block_end_parts(model: HookedTransformer, cache: ActivationCache, layer: int) -> _Parts:
    """What block `layer` adds after its MLP: its per-layer term (Gemma 4's small sizes), and
    its scalar over every term so far (`resid_post_scale`)."""
    parts = []
    if model.cfg.d_per_layer_input is not None:
        write = activation(cache, f"blocks.{layer}.hook_per_layer_out")[None]
        parts.append(_given((f"L{layer}_per_layer",), write))
    if model.cfg.resid_post_scale:
        parts.append(_Part((), scale=model.blocks[layer].resid_scale.w))
    return parts


def _mixing_parts(
    model: HookedTransformer, cache: ActivationCache, layer: int, granularity: str
) -> _Parts:
    """The attention's parts, and the write of a mixer beside it (one term) where there is
    one (Falcon-H1); none in a block that mixes no positions (Nemotron-H's MLP layers)."""
    mixing, kind, _, _ = block_layout(model, layer)
    parts = _attn_parts(model, cache, layer, granularity) if mixing else []
    if kind:
        parts.append(_given((f"L{layer}_{kind}",), cache[f"blocks.{layer}.hook_mixer_out"][None]))
    return parts


def _feature_parts(
    model: HookedTransformer,
    cache: ActivationCache,
    site: str,
    layer: int,
    sae: SparseAutoencoder | None,
) -> _Parts:
    """The SAE's terms at its point, then the sublayers between it and `(site, layer)`."""
    if sae is None:
        raise ValueError(
            "granularity='features' needs the SAE that was spliced when the cache was "
            "recorded: decompose_resid(model, cache, ..., granularity='features', sae=sae)"
        )
    at_sae = {label for part in _parts(model, cache, *sae_point(model, sae), "sublayer")
              for label in part.labels}  # fmt: skip
    here = _parts(model, cache, site, layer, "sublayer")
    if not at_sae <= {label for part in here for label in part.labels}:
        raise ValueError(
            f"the SAE reads {sae.cfg.hook_name}, after {get_act_name(site, layer)}: a feature "
            f"decomposition is of the SAE's point or a later one"
        )
    # The parts at the SAE's point come first in `here` (a block's scalar among them).
    n_at_sae = len(_parts(model, cache, *sae_point(model, sae), "sublayer"))
    return [_given(*feature_terms(cache, sae)), *here[n_at_sae:]]


def accumulated_resid(
    model: HookedTransformer,
    cache: ActivationCache,
    layer: int | None = None,
    *,
    incl_mid: bool = False,
) -> AccumulatedResid:
    """The residual stream at each block boundary up to `resid_pre` of `layer`.

    Entries `L0_resid_pre`, `L1_resid_pre`, ..., and `final` (the stream `ln_final`
    reads) when `layer` is None or `n_layers`; with `incl_mid`, each block's
    `L{l}_resid_mid` between them (none in parallel or attention-only blocks, which have
    no resid_mid). The entries are the cached streams themselves.
    """
    n_layers = model.cfg.n_layers
    site, last = _resolve_point(model, layer, "resid_pre")
    stop = n_layers if site == "resid_post" else last
    keys: list[tuple[str, tuple[str, int]]] = []
    has_mid = model.cfg.has_mlp and not model.cfg.parallel_attn_mlp
    for block in range(stop):
        keys.append((f"L{block}_resid_pre", ("resid_pre", block)))
        if incl_mid and has_mid and hasattr(model.blocks[block], "hook_resid_mid"):
            keys.append((f"L{block}_resid_mid", ("resid_mid", block)))
    if site == "resid_post":
        keys.append(("final", ("resid_post", n_layers - 1)))
    else:
        keys.append((f"L{stop}_resid_pre", ("resid_pre", stop)))
    streams = torch.stack([activation(cache, key) for _, key in keys])
    return AccumulatedResid(streams, tuple(label for label, _ in keys), site, last)
