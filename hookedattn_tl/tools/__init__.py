"""TransformerLens 3.x's `tools` package: `tools.analysis` (direct path patching)."""

from hookedattn_tl.tools import analysis

__all__ = ["analysis"]
