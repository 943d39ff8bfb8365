"""Embeddings of another width than the stream: their terms through the projection into it,
and refusals for circuit analyses that read `W_E` or `W_U` as `d_model` wide.

A model whose embeddings are `d_embed` wide reaches the stream through a projection (after
the embeddings' norm: ELECTRA, RemBERT; `components.embed_projection`), and one whose head
maps the stream to `d_unembed` reads `W_U` at that width: `W_E @ W_Q` or `W_O @ W_U` are
then no products of the stream's weights. Rather than read an "effective" `W_E` that the
norm between makes no linear map, these analyses refuse such a model by name. The residual
decomposition still sums there (`analysis.decomposition`: each embedding term through the
norm at its recorded scale, then through `W_proj`, `b_proj` a term of its own).
"""

from typing import Any

import torch
from einops import einsum
from jaxtyping import Float
from torch import Tensor

from analysis._reading import weight
from hookedattn.core.components.embed_projection import NoProjection


def through_embed_projection(
    model: Any, components: Float[Tensor, "term batch pos d_embed"], labels: tuple[str, ...]
) -> tuple[Float[Tensor, "term2 batch pos d_model"], tuple[str, ...]]:
    """Terms of the (normed) embeddings through `embed_proj` into the stream: each term
    times `W_proj`, and `b_proj` one more term (`embed_proj_bias`). If the terms summed to
    the projection's input they sum to the stream entering block 0, exactly. The identity
    (terms and labels unchanged) where the model has no projection."""
    projection = model.embed_proj
    if isinstance(projection, NoProjection):
        return components, labels
    W_proj = weight(projection.W_proj, components)
    projected = einsum(
        components, W_proj, "term batch pos d_embed, d_embed d_model -> term batch pos d_model"
    )
    bias = torch.broadcast_to(weight(projection.b_proj, projected), projected.shape[1:])
    return torch.cat([projected, bias[None]]), (*labels, "embed_proj_bias")


def require_stream_embeddings(model: Any, what: str, unembedding: bool = False) -> None:
    """Refuse `what` where `W_E` (and with `unembedding`, `W_U`) is not `d_model` wide."""
    cfg = model.cfg
    if cfg.d_embed is not None:
        raise ValueError(
            f"{what} reads W_E as the stream's rows, but this model's embeddings are "
            f"d_embed={cfg.d_embed} wide and reach the d_model={cfg.d_model} stream through "
            f"ln_embed and embed_proj (W_proj: [d_embed d_model]); read model.W_E and "
            f"model.embed_proj.W_proj yourself, or decompose the stream (decompose_resid)"
        )
    if unembedding and cfg.d_unembed is not None:
        raise ValueError(
            f"{what} reads W_U as d_model wide, but this model's head maps the stream to "
            f"d_unembed={cfg.d_unembed} (unembed_transform) before W_U reads it"
        )
