"""`transformer_lens.model_bridge` (TransformerLens 4's entry) over hookedattn.

After the alias line (`hookedattn_tl.install()`), TL 4's

    from transformer_lens.model_bridge import TransformerBridge
    bridge = TransformerBridge.boot_transformers("gpt2", device="cpu")
    bridge.enable_compatibility_mode()

gives `hookedattn_tl`'s model (`TransformerBridge`, a `hookedattn_tl.HookedTransformer`),
which answers TL 4's hook names as aliases of TL 3's (`hook_names`). TL 4's adapters and
generalized components have no counterpart: asking for one says what to use instead.
"""

from hookedattn_tl.model_bridge import hook_names
from hookedattn_tl.model_bridge.transformer_bridge import TransformerBridge

# TL 4's other public names here: its machinery for wrapping a HF module tree.
_WRAPPING = (
    "ArchitectureAdapter", "BridgeCore", "RemoteBridge", "AttentionBridge", "BlockBridge",
    "EmbeddingBridge", "NormalizationBridge", "JointQKVAttentionBridge",
    "JointGateUpMLPBridge", "LinearBridge", "MLPBridge", "MoEBridge", "UnembeddingBridge",
)  # fmt: skip


def __getattr__(name: str) -> object:
    if name in _WRAPPING:
        raise ImportError(
            f"transformer_lens.model_bridge.{name} is TransformerLens 4's wrapping of a "
            f"HuggingFace module tree, which hookedattn_tl does not have: it converts the "
            f"weights into its own modules. Use TransformerBridge.boot_transformers(name) "
            f"(or hookedattn_tl.HookedTransformer) and its hook points",
            name=name,
        )
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["TransformerBridge", "hook_names"]
