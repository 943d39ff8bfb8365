"""TransformerLens 2.x's `HookedTransformerConfig` module path (3.x: `config`): the same class."""

from hookedattn_tl.config.hooked_transformer_config import HookedTransformerConfig

__all__ = ["HookedTransformerConfig"]
