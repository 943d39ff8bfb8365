"""TransformerLens's `components.attention`: `Attention`."""

from hookedattn_tl.components.abstract_attention import Attention

__all__ = ["Attention"]
