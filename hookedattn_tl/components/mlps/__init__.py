"""TransformerLens's `components.mlps`: `MLP`, `GatedMLP`, `CanBeUsedAsMLP`."""

from hookedattn_tl.components.mlps import can_be_used_as_mlp, gated_mlp, mlp
from hookedattn_tl.components.mlps.can_be_used_as_mlp import CanBeUsedAsMLP
from hookedattn_tl.components.mlps.gated_mlp import GatedMLP
from hookedattn_tl.components.mlps.mlp import MLP

__all__ = ["MLP", "CanBeUsedAsMLP", "GatedMLP", "can_be_used_as_mlp", "gated_mlp", "mlp"]
