"""TransformerLens's `HookedTransformerConfig` module: ours, frozen, computing as TL does.

Change a field with `cfg.replace(field=value)` (a new, validated config); on a model, the
`set_use_*` methods of `hookedattn_tl.HookedTransformer` change the hook-point flags.
"""

import dataclasses

from hookedattn.core.config import HookedTransformerConfig as _CoreConfig

__all__ = ["HookedTransformerConfig"]


@dataclasses.dataclass(frozen=True)
class HookedTransformerConfig(_CoreConfig):
    """`hookedattn.HookedTransformerConfig`, with every activation written out by default.

    TransformerLens computes attention and norms step by step whether or not a hook reads
    them, so `model(x)` equals `run_with_cache(x)[0]` bit for bit, and TL code (its own
    tests included) compares them with `torch.allclose`'s default tolerance. Here that
    holds too: `use_fused_kernels` defaults to False. Pass `use_fused_kernels=True` for the
    fused kernels (the same numbers to float rounding, faster where nothing is hooked).
    """

    use_fused_kernels: bool = False
