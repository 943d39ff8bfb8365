"""TransformerLens 3.x's `conversion_utils.conversion_steps`: the base conversion hook points use.

TL's other conversion steps rearrange HF weights for its TransformerBridge, which
hookedattn_tl does not have (our HF importers convert weights in `hookedattn.core.hf`).
"""

from hookedattn_tl.conversion_utils.conversion_steps import base_tensor_conversion
from hookedattn_tl.conversion_utils.conversion_steps.base_tensor_conversion import (
    BaseTensorConversion,
)

__all__ = ["BaseTensorConversion", "base_tensor_conversion"]
