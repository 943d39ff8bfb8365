"""Embeddings of another width than the stream, and the linear maps between them.

ELECTRA's embeddings are `embedding_size` wide: their sum is normed at that width, then
`embeddings_project` maps it to `hidden_size`; RemBERT's are `input_embedding_size` wide,
mapped by `encoder.embedding_hidden_mapping_in`. On the way out both heads' dense maps go
to a width of their own (`embedding_size`, `output_embedding_size`), which the decoder
reads. Our model holds these as `d_embed` with `embed_proj` and `d_unembed`
(`components.embed_projection`, `components.unembed_transform`).

Recognised on the twin's run (`_split_layers`): the projection is the one linear map
outside the layers whose output is what entered the first layer; the embedding is then
read from its input as from any other. The widths are read back into the real checkpoint's
config by the field of the twin's config that holds them (`embed_width`, `head_width`);
`embed_fields` and `embed_rules` are the convention's config fields and tensor rules for them.
"""

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

from hookedattn.core.hf._recognised import Anatomy
from hookedattn.core.hf._table import Rule, zeros


@dataclasses.dataclass(frozen=True)
class Projection:
    """The map from the embeddings into the stream (None: there is none), whether it has
    a bias, the config field naming the embeddings' width, and what the map read (the
    stream entering the first layer where there is no map)."""

    name: str | None
    bias: bool
    width_field: str | None
    reads: Tensor


def embed_projection(
    twin: nn.Module, seen: dict[str, Any], linears: dict[str, nn.Module]
) -> Projection:
    """The linear map among `linears` (outside the layers) whose output entered the first
    layer, as `seen` on the twin's run (`linear:{name}`: its input and output)."""
    entering = seen["layer"][0]
    found = [n for n in linears if f"linear:{n}" in seen
             and _same(seen[f"linear:{n}"][1], entering)]  # fmt: skip
    if not found:
        return Projection(None, True, None, entering)
    if len(found) > 1:
        raise ValueError(f"several linear maps write the first layer's input: {found}")
    module = twin.get_submodule(found[0])
    field = width_field(twin.config, module.in_features, "input", "the embeddings'")
    return Projection(found[0], module.bias is not None, field, seen[f"linear:{found[0]}"][0])


def anatomy_fields(
    twin: nn.Module, config: Any, projection: Projection, dense: str | None
) -> dict[str, Any]:
    """`Anatomy`'s fields for the widths: the embeddings' `projection` and the head's dense
    map `dense` (None: no head transform)."""
    return dict(
        embed_proj=projection.name,
        embed_proj_bias=projection.bias,
        embed_width=projection.width_field,
        head_width=head_width(twin, config, dense),
    )


def head_width(twin: nn.Module, config: Any, dense: str | None) -> str | None:
    """The config field naming the width the head's dense map `dense` writes (and the
    decoder reads); None where there is no head or it keeps the stream's width."""
    if dense is None:
        return None
    width = twin.get_submodule(dense).out_features
    if width == config.hidden_size:
        return None
    return width_field(config, width, "output", f"the head's ({dense})")


def width_field(config: Any, width: int, side: str, what: str) -> str:
    """The field of `config` that holds an embedding width `width`: among the fields named
    for an embedding's size, the one of that value, preferring those named for `side`
    ("input" or "output") where several are."""
    fields = config.to_dict()
    named = [k for k, v in fields.items() if "embed" in k and k.endswith(("_size", "_dim"))
             and v == width and not isinstance(v, bool)]  # fmt: skip
    sided = [k for k in named if side in k] or named
    if len(sided) != 1:
        raise ValueError(
            f"{what} width {width} is named by {sided or 'no field'} of the config (fields "
            f"named for an embedding's size: {[k for k in fields if 'embed' in k]})"
        )
    return sided[0]


def _same(a: Tensor, b: Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(
        a.double(), b.double(), rtol=1e-5, atol=1e-5 * (float(b.abs().max()) + 1e-12)
    )


def embed_fields(hf_config: Any, anatomy: Anatomy) -> dict[str, Any]:
    """`d_embed` and `d_unembed` where the embeddings or the head are not the stream's
    width (above), read from the config fields that name them."""
    a, fields = anatomy, {}
    if a.embed_proj is not None:
        fields["d_embed"] = getattr(hf_config, a.embed_width)
    if a.head_width is not None:
        fields["d_unembed"] = getattr(hf_config, a.head_width)
    return fields


def embed_rules(anatomy: Anatomy) -> list[Rule]:
    """The linear map from the embeddings into the stream (`embed_proj`), if any."""
    a = anatomy
    if a.embed_proj is None:
        return []
    bias = (Rule("embed_proj.b_proj", f"{a.embed_proj}.bias", "d_model -> d_model")
            if a.embed_proj_bias else zeros("embed_proj.b_proj", "d_model"))  # fmt: skip
    return [
        Rule("embed_proj.W_proj", f"{a.embed_proj}.weight", "d_model d_embed -> d_embed d_model"),
        bias,
    ]
