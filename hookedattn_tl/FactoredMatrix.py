"""TransformerLens's `FactoredMatrix` module: ours (`hookedattn.factored_matrix`)."""

from hookedattn.factored_matrix import SVD, FactoredMatrix

__all__ = ["SVD", "FactoredMatrix"]
