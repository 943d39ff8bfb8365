"""TransformerLens 3.x's `config.transformer_lens_config`: `TransformerLensConfig`.

TL's base config (the fields every model shares); here the same class as
`HookedTransformerConfig`, which holds all of them.
"""

from hookedattn_tl.config.hooked_transformer_config import (
    HookedTransformerConfig,
    TransformerLensConfig,
)

__all__ = ["HookedTransformerConfig", "TransformerLensConfig"]
