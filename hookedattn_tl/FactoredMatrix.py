"""TransformerLens's `FactoredMatrix` module: ours (`hookedattn.core.factored_matrix`)."""

from hookedattn.core.factored_matrix import SVD, FactoredMatrix

__all__ = ["SVD", "FactoredMatrix"]
