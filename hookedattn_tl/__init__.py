"""hookedattn_tl: TransformerLens 3.x's surface over hookedattn, for code that ports by one import.

    import hookedattn_tl as transformer_lens
    from hookedattn_tl import HookedTransformer, HookedTransformerConfig, utils, patching

The modules mirror TransformerLens's: `HookedTransformer` (a subclass of ours whose
`run_with_cache` returns `ActivationCache`, TL's cache with its analysis methods bound to
the model), `hook_points`, `utils` (`get_act_name` with every TL shorthand, `Slice`,
`test_prompt`, ...), `patching` (TL's argument order, our batched engine), and
`FactoredMatrix`. Every method is built on `hookedattn` and `analysis`; the README's
"Porting from TransformerLens" table lists where this package still differs from TL, and
why.
"""

from hookedattn.core.factored_matrix import FactoredMatrix
from hookedattn.core.hook_points import HookedRootModule, HookPoint
from hookedattn_tl import hook_points, patching, utils
from hookedattn_tl.ActivationCache import ActivationCache
from hookedattn_tl.HookedTransformer import HookedTransformer
from hookedattn_tl.HookedTransformerConfig import HookedTransformerConfig
from hookedattn_tl.past_key_value_caching import (
    HookedTransformerKeyValueCache,
    HookedTransformerKeyValueCacheEntry,
    TransformerLensKeyValueCache,
    TransformerLensKeyValueCacheEntry,
)

# TL 3.x also exposes `utils` as `utilities`.
utilities = utils

__all__ = [
    "ActivationCache",
    "FactoredMatrix",
    "HookPoint",
    "HookedRootModule",
    "HookedTransformer",
    "HookedTransformerConfig",
    "HookedTransformerKeyValueCache",
    "HookedTransformerKeyValueCacheEntry",
    "TransformerLensKeyValueCache",
    "TransformerLensKeyValueCacheEntry",
    "hook_points",
    "patching",
    "utilities",
    "utils",
]
