"""TransformerLens's `components`, with TL's constructors (`Attention(cfg)`, `MLP(cfg)`, ...).

Each is `hookedattn`'s component (or, for TL's MLP activations beyond ours, a standalone
one), built from a config or a dict of its fields and initialised on its own. Our models
build their components from the config (`hookedattn.core.components`); these are for
TL code that builds one by hand.
"""

from hookedattn_tl.components import (
    abstract_attention,
    attention,
    grouped_query_attention,
    mlps,
    norms,
)
from hookedattn_tl.components.abstract_attention import (
    AbstractAttention,
    Attention,
    GroupedQueryAttention,
)
from hookedattn_tl.components.mlps import MLP, CanBeUsedAsMLP, GatedMLP
from hookedattn_tl.components.norms import LayerNorm, LayerNormPre, RMSNorm, RMSNormPre

__all__ = [
    "MLP",
    "AbstractAttention",
    "Attention",
    "CanBeUsedAsMLP",
    "GatedMLP",
    "GroupedQueryAttention",
    "LayerNorm",
    "LayerNormPre",
    "RMSNorm",
    "RMSNormPre",
    "abstract_attention",
    "attention",
    "grouped_query_attention",
    "mlps",
    "norms",
]
