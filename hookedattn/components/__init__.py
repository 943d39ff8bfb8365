"""The layers a `HookedTransformer` is built from, one concept per file."""

from hookedattn.components.attention import Attention
from hookedattn.components.block import AttnOnlyBlock, Block
from hookedattn.components.embed import Embed, PosEmbed, Unembed
from hookedattn.components.mlp import MLP
from hookedattn.components.norm import LayerNorm, LayerNormPre, RMSNorm, RMSNormPre
from hookedattn.components.rotary import Rotary

__all__ = [
    "MLP",
    "Attention",
    "AttnOnlyBlock",
    "Block",
    "Embed",
    "LayerNorm",
    "LayerNormPre",
    "PosEmbed",
    "RMSNorm",
    "RMSNormPre",
    "Rotary",
    "Unembed",
]
