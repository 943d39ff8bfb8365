"""TransformerLens 3.x's `utilities.activation_functions`: TL's activations by name."""

from hookedattn_tl._activations import (
    SUPPORTED_ACTIVATIONS,
    gelu_fast,
    gelu_new,
    gelu_pytorch_tanh,
    solu,
)

__all__ = ["SUPPORTED_ACTIVATIONS", "gelu_fast", "gelu_new", "gelu_pytorch_tanh", "solu"]
