"""TransformerLens 3.x's `config` package: `HookedTransformerConfig`, `TransformerLensConfig`."""

from hookedattn_tl.config import hooked_transformer_config, transformer_lens_config
from hookedattn_tl.config.hooked_transformer_config import (
    HookedTransformerConfig,
    TransformerLensConfig,
)

__all__ = [
    "HookedTransformerConfig",
    "TransformerLensConfig",
    "hooked_transformer_config",
    "transformer_lens_config",
]
