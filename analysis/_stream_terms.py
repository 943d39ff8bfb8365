"""The residual stream's terms at the `"sublayer"` granularity (the cached embeddings and
sublayer outputs, in the order they were written), what each block writes, and the stream
written through norms of its own (post-residual norms, normed skips, an embedding norm or
projection): the parts of `analysis.decomposition` that read the model's layout rather than
split a sublayer."""

import functools

import torch
from jaxtyping import Float
from torch import Tensor

from analysis._reading import activation
from analysis._widths import through_embed_projection
from analysis.normalization import NormSite, through_norm
from hookedattn.core.cache import ActivationCache
from hookedattn.core.model import HookedTransformer
from hookedattn.core.names import get_act_name


def normed_stream(cfg: object) -> bool:
    """Whether norms rescale the stream itself (post-residual norms, an embedding norm, the
    normed skips of `normed_skip`), or a projection maps the embeddings into it (`d_embed`)."""
    placement = cfg.normalization_placement == "post_residual" or cfg.normed_skip
    return placement or cfg.embed_norm or bool(cfg.d_embed)


def through_stream_norms(
    model: HookedTransformer, cache: ActivationCache, site: str, layer: int
) -> tuple[Float[Tensor, "component batch pos d_model"], tuple[str, ...]]:
    """The stream at `(site, layer)` where norms rescale the stream itself (module
    docstring): the embeddings and each sublayer's write, each passed through every norm of
    the stream after it at the scale the forward recorded (`through_norm`: centred, divided,
    times the gain), each norm's bias a term of its own (`ln_embed_bias`,
    `L0_ln_resid_mid_bias`, ...), the embeddings' terms then through their projection into
    the stream where there is one (`embed_proj_bias` a term). They sum to the stream
    exactly."""
    terms = sublayer_terms(model, site, layer)
    embeddings = [(label, name) for label, name in terms if label in ("embed", "pos_embed")]
    components = torch.stack([activation(cache, name) for _, name in embeddings])
    labels = tuple(label for label, _ in embeddings)
    components, labels = through_norm(model, cache, NormSite("ln_embed"), components, labels)
    components, labels = through_embed_projection(model, components, labels)
    post_residual = model.cfg.normalization_placement == "post_residual"
    for label, name in terms[len(embeddings) :]:
        if model.cfg.normed_skip:  # the stream so far passes the sublayer by its normed skip
            components, labels = _through_normed_skip(model, cache, label, components, labels)
        components = torch.cat([components, activation(cache, name)[None]])
        labels = (*labels, label)
        block, sublayer = int(label[1 : label.index("_")]), label.rsplit("_", 1)[1]
        if post_residual:
            which = "ln_resid_mid" if sublayer == "attn" else "ln_resid_post"
            norm = NormSite(which, block)
            components, labels = through_norm(model, cache, norm, components, labels)
    return components, labels


def _through_normed_skip(
    model: HookedTransformer,
    cache: ActivationCache,
    label: str,
    components: Float[Tensor, "component batch pos d_model"],
    labels: tuple[str, ...],
) -> tuple[Float[Tensor, "component batch pos d_model"], tuple[str, ...]]:
    """The terms of the stream a sublayer (`label`'s) reads, as its skip passes them on in
    a `normed_skip` block: through the sublayer's norm, times the skip's scale."""
    block, sublayer = int(label[1 : label.index("_")]), label.rsplit("_", 1)[1]
    which, scale = ("ln2", model.cfg.mlp_skip_scale) if sublayer == "mlp" else (
        "ln1", model.cfg.attn_skip_scale)  # fmt: skip
    components, labels = through_norm(model, cache, NormSite(which, block), components, labels)
    return components * scale, labels


def sublayer_terms(model: HookedTransformer, site: str, layer: int) -> tuple[tuple[str, str], ...]:
    """`(label, hook name)` of each term of the stream at `(site, layer)` at granularity
    `"sublayer"`: the cached embeddings and sublayer outputs (biases included)."""
    learned_positions = model.cfg.positional_embedding_type == "standard"
    layout = tuple(block_layout(model, block) for block in range(model.cfg.n_layers))
    return _sublayer_names(learned_positions, site, layer, layout)


def block_layout(model: HookedTransformer, layer: int) -> tuple[str, str, bool, bool]:
    """What block `layer` writes: the kind of its sublayer that mixes positions ("attention",
    a mixer in attention's place, "mamba2", ..., or "" where there is none: Nemotron-H's
    MLP-only blocks), the kind of a mixer beside its attention (Falcon-H1's; "" if none),
    whether it holds an MLP, whether it writes a per-layer term (Gemma 4's
    `hook_per_layer_out`)."""
    cfg = model.cfg
    kind = cfg.layer_mixer(layer)
    beside = cfg.mixers.layer_mixers(layer) if kind == "attention" and cfg.mixers else ()
    per_layer = cfg.d_per_layer_input is not None
    mixing = "" if kind == "none" else kind
    return mixing, beside[0] if beside else "", cfg.layer_has_mlp(layer), per_layer


def block_extras(cfg: object) -> bool:
    """Whether blocks scale the stream they leave or write a per-layer term (Gemma 4's)."""
    return bool(cfg.resid_post_scale) or cfg.d_per_layer_input is not None


@functools.lru_cache(maxsize=256)
def _sublayer_names(
    learned_positions: bool,
    site: str,
    layer: int,
    layout: tuple[tuple[str, str, bool, bool], ...],
) -> tuple[tuple[str, str], ...]:
    # Memoised: a function of the model's shape only, on the path of every sublayer call.
    terms = [("embed", get_act_name("embed"))]
    if learned_positions:
        terms.append(("pos_embed", get_act_name("pos_embed")))

    def mixing(block: int) -> None:
        mixing, beside, _, _ = layout[block]
        if mixing:  # attention's write, or that of a mixer in its place, labelled by its kind
            label = "attn" if mixing == "attention" else mixing
            terms.append((f"L{block}_{label}", get_act_name("attn_out", block)))
        if beside:  # its write beside the attention's, a term of its own
            terms.append((f"L{block}_{beside}", f"blocks.{block}.hook_mixer_out"))

    for block in range(layer + 1 if site == "resid_post" else layer):
        mixing(block)
        if layout[block][2]:
            terms.append((f"L{block}_mlp", get_act_name("mlp_out", block)))
        if layout[block][3]:
            terms.append((f"L{block}_per_layer", f"blocks.{block}.hook_per_layer_out"))
    if site == "resid_mid":
        mixing(layer)
    return tuple(terms)
