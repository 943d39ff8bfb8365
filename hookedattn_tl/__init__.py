"""hookedattn_tl: TransformerLens 3.x's surface over hookedattn, for code that ports unchanged.

The porting path is one line, first in a TransformerLens script:

    import hookedattn_tl.as_transformer_lens  # or: hookedattn_tl.install()

after which `import transformer_lens` and every `from transformer_lens.X.Y import ...` reach
this package's module of the same path (it refuses, by name, to shadow a real TransformerLens
that is already imported). Importing it directly works too:

    import hookedattn_tl as transformer_lens
    from hookedattn_tl import HookedTransformer, HookedTransformerConfig, utils, patching

The modules mirror TransformerLens's: `HookedTransformer` (a subclass of ours whose
`run_with_cache` returns `ActivationCache`, TL's cache with its analysis methods bound to
the model), `HookedRootModule` and `hook_points` (hook levels, handles, introspection),
`config`, `utils` / `utilities`, `patching` (TL's argument order, our batched engine),
`FactoredMatrix`, `cache` (the key/value cache), `conversion_utils`, `model_bridge`
(TransformerLens 4's entry: `TransformerBridge.boot_transformers`, TL 4's hook names); and
SAELens 6's `HookedSAETransformer` (SAEs attached by hook name, cached under SAELens's
names; SAELens's `from sae_lens import HookedSAETransformer` ports as `from hookedattn_tl
import HookedSAETransformer`). Every method is built on `hookedattn` and `analysis`;
docs/guide/porting.md lists where this package still differs from TL, and why.
"""

from hookedattn_tl import (
    cache,
    components,
    config,
    conversion_utils,
    hook_points,
    model_bridge,
    patching,
    tools,
    utilities,
    utils,
)
from hookedattn_tl._alias import install, uninstall
from hookedattn_tl.ActivationCache import ActivationCache
from hookedattn_tl.cache.key_value_cache import TransformerLensKeyValueCache
from hookedattn_tl.cache.key_value_cache_entry import TransformerLensKeyValueCacheEntry
from hookedattn_tl.config import HookedTransformerConfig, TransformerLensConfig
from hookedattn_tl.FactoredMatrix import FactoredMatrix
from hookedattn_tl.hook_points import HookPoint
from hookedattn_tl.HookedRootModule import HookedRootModule
from hookedattn_tl.HookedSAETransformer import HookedSAETransformer
from hookedattn_tl.HookedTransformer import HookedTransformer
from hookedattn_tl.model_bridge import TransformerBridge
from hookedattn_tl.past_key_value_caching import (
    HookedTransformerKeyValueCache,
    HookedTransformerKeyValueCacheEntry,
)

__all__ = [
    "ActivationCache",
    "FactoredMatrix",
    "HookPoint",
    "HookedRootModule",
    "HookedSAETransformer",
    "HookedTransformer",
    "HookedTransformerConfig",
    "HookedTransformerKeyValueCache",
    "HookedTransformerKeyValueCacheEntry",
    "TransformerBridge",
    "TransformerLensConfig",
    "TransformerLensKeyValueCache",
    "TransformerLensKeyValueCacheEntry",
    "cache",
    "components",
    "config",
    "conversion_utils",
    "hook_points",
    "install",
    "model_bridge",
    "patching",
    "tools",
    "uninstall",
    "utilities",
    "utils",
]
