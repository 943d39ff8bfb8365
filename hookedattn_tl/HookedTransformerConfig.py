"""TransformerLens's `HookedTransformerConfig` module: ours, frozen.

Change a field with `cfg.replace(field=value)` (a new, validated config); on a model, the
`set_use_*` methods of `hookedattn_tl.HookedTransformer` change the hook-point flags.
"""

from hookedattn.config import HookedTransformerConfig

__all__ = ["HookedTransformerConfig"]
