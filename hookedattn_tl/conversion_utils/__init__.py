"""TransformerLens 3.x's `conversion_utils`: the tensor conversion hook points accept."""

from hookedattn_tl.conversion_utils import conversion_steps
from hookedattn_tl.conversion_utils.conversion_steps import BaseTensorConversion

__all__ = ["BaseTensorConversion", "conversion_steps"]
