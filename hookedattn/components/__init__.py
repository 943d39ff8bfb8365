"""The layers a `HookedTransformer` is built from, one concept per file.

Each variant is its own small module, chosen when the model is built (`make_block`,
`make_attention`, `make_mlp`, `make_norm`, `make_soft_cap`), so that every forward stays
the equation it implements.
"""

from hookedattn.components.attention import Attention, GroupedQueryAttention, make_attention
from hookedattn.components.block import AttnInputs, AttnOnlyBlock, Block, ParallelBlock, make_block
from hookedattn.components.embed import Embed, PosEmbed, Unembed, affine
from hookedattn.components.mlp import MLP, GatedMLP, gelu_new, make_mlp
from hookedattn.components.norm import (
    LayerNorm,
    LayerNormPre,
    NoNorm,
    RMSNorm,
    RMSNormPre,
    make_norm,
    make_placed_norm,
)
from hookedattn.components.rotary import Rotary, rotary_frequencies
from hookedattn.components.soft_cap import SoftCap, make_soft_cap

__all__ = [
    "MLP",
    "Attention",
    "AttnInputs",
    "AttnOnlyBlock",
    "Block",
    "Embed",
    "GatedMLP",
    "GroupedQueryAttention",
    "LayerNorm",
    "LayerNormPre",
    "NoNorm",
    "ParallelBlock",
    "PosEmbed",
    "RMSNorm",
    "RMSNormPre",
    "Rotary",
    "SoftCap",
    "Unembed",
    "affine",
    "gelu_new",
    "make_attention",
    "make_block",
    "make_mlp",
    "make_norm",
    "make_placed_norm",
    "make_soft_cap",
    "rotary_frequencies",
]
