"""`transformer_lens.model_bridge.bridge`, the older import path of `TransformerBridge`."""

from hookedattn_tl.model_bridge.transformer_bridge import TransformerBridge

__all__ = ["TransformerBridge"]
