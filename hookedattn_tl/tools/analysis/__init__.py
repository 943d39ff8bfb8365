"""TransformerLens 3.x's `tools.analysis`: direct path patching."""

from hookedattn_tl.tools.analysis import direct_path_patching
from hookedattn_tl.tools.analysis.direct_path_patching import (
    get_act_patch_direct_path,
    get_act_patch_direct_path_all_sources,
)

__all__ = [
    "direct_path_patching",
    "get_act_patch_direct_path",
    "get_act_patch_direct_path_all_sources",
]
