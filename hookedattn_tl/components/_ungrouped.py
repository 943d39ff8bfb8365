"""TransformerLens's `ungroup_grouped_query_attention`: grouped-query attention run per head.

With the flag, TL's grouped-query attention computes keys and values with `W_K`, `W_V`
(each key/value head repeated for every query head of its group) instead of the stored
`_W_K`, `_W_V`, so `hook_k`, `hook_v` (and a block's `hook_k_input`, `hook_v_input`) have
`n_heads` heads, one per query head, and a hook may edit one query head's keys alone. The
output is the same until a hook does. Here an attention layer is switched by
`set_ungrouped`: its key/value weights become the repeated ones (`key_value_weights`, read by
every projection), each query head its own group (`group = 1`), and its fused q/k/v product
sized to match; the parameters stay `_W_K`, `_W_V`, `_b_K`, `_b_V`.
"""

from typing import Any

from einops import repeat
from torch import Tensor

from hookedattn.core._variants import reclass, variant_base
from hookedattn.core.components import attention as _core
from hookedattn.core.kernels import FusedQKV


class _Ungrouped:
    """Keys and values by the repeated weights, one per query head (the module docstring)."""

    def key_value_weights(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """`W_K, b_K, W_V, b_V` per query head: each stored key/value head repeated."""
        return self.W_K, self.b_K, self.W_V, self.b_V

    def _per_query_head(self, weight: Tensor) -> Tensor:
        # `group` is 1 here (each query head reads its own keys); the stored heads are
        # repeated by their own ratio.
        ratio = self.W_Q.shape[0] // weight.shape[0]
        return repeat(weight, "kv_head ... -> (kv_head group) ...", group=ratio)


class UngroupedQueryAttention(_Ungrouped, _core.GroupedQueryAttention):
    """A model's grouped-query attention layer with TL's flag on."""


# A grouped class -> its ungrouped one (filled by the classes that have one).
UNGROUPED: dict[type, type] = {_core.GroupedQueryAttention: UngroupedQueryAttention}


def set_ungrouped(attn: Any, cfg: Any, ungrouped: bool) -> None:
    """Switch a grouped-query attention layer to keys and values per query head, or back."""
    if cfg.use_qk_norm and not cfg.qk_norm_per_head and ungrouped:
        raise ValueError(
            "ungroup_grouped_query_attention=True with use_qk_norm over all heads "
            "(qk_norm_per_head=False): the key norm's gain is sized for the "
            f"{cfg.n_kv_heads} key/value heads; leave the flag off for this model"
        )
    bases = [base for base, flat in UNGROUPED.items() if variant_base(type(attn)) in (base, flat)]
    if not bases:
        raise ValueError(
            f"ungroup_grouped_query_attention: {type(attn).__name__} is not a grouped-query "
            f"attention layer this flag applies to ({', '.join(c.__name__ for c in UNGROUPED)})"
        )
    grouped = bases[0]
    reclass(attn, UNGROUPED[grouped] if ungrouped else grouped)
    per_query_head = cfg.replace(n_key_value_heads=None) if ungrouped else cfg
    attn.group = cfg.n_heads // per_query_head.n_kv_heads
    attn.fused_qkv = FusedQKV(per_query_head)
