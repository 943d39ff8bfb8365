"""TransformerLens's attention components with TL's constructors, over our attention.

`Attention(cfg)` (a config or a dict of its fields) is `hookedattn`'s attention sublayer,
initialised on its own (weights normal with standard deviation `cfg.init_range`, biases
zero) and runnable on its own: `attn(query_input, key_input, value_input)` builds the causal
(or windowed, or padded) masks itself, as TL's does. `mask` is an empty buffer, as in TL
3.5 (no `n_ctx x n_ctx` mask is kept). `AbstractAttention.create_alibi_slope` and
`create_alibi_bias` are ALiBi's distance penalties (Press et al. 2022), for code that
builds them; our models do not use ALiBi.
"""

from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from hookedattn.core import hook_points as _core_hooks
from hookedattn.core.components import attention as _core
from hookedattn.core.kernels import attention_context
from hookedattn.core.kv_cache import KeyValueCache
from hookedattn_tl.config import HookedTransformerConfig
from hookedattn_tl.hook_points import HookPoint

AttnInput = Float[Tensor, "batch pos d_model"] | Float[Tensor, "batch pos head d_model"]


def _initialised(module: nn.Module, cfg: HookedTransformerConfig) -> None:
    # A standalone component is not filled by a model's init_weights: TL's defaults here.
    for name, parameter in module.named_parameters(recurse=False):
        with torch.no_grad():
            if name.lstrip("_").startswith("b_"):
                parameter.zero_()
            else:
                parameter.normal_(0.0, cfg.init_range)


class AbstractAttention(_core.Attention):
    """Our attention sublayer with TL's constructor `(cfg, attn_type, layer_id)` and TL's
    standalone forward; the ALiBi helpers as static methods."""

    def __init__(self, cfg: Any, attn_type: str = "global", layer_id: int | None = None):
        cfg = HookedTransformerConfig.unwrap(cfg)
        if attn_type not in ("global", "local"):
            raise ValueError(f"attn_type must be 'global' or 'local', got {attn_type!r}")
        super().__init__(cfg, 0 if layer_id is None else layer_id)
        self.cfg = cfg
        self.layer_id = layer_id
        if attn_type == "local" and cfg.window_size is None:
            raise ValueError("attn_type='local' needs cfg.window_size")
        self.attn_type = attn_type
        self.register_buffer("mask", torch.empty(0, 0, dtype=torch.bool))
        _initialised(self, cfg)
        for module in self.modules():
            if type(module) is _core_hooks.HookPoint:
                module.__class__ = HookPoint  # TL's hook API on the same hook points

    def forward(
        self,
        query_input: Float[Tensor, "batch pos d_model"] | Float[Tensor, "batch pos head d_model"],
        key_input: Float[Tensor, "batch kv_pos d_model"]
        | Float[Tensor, "batch kv_pos head d_model"],
        value_input: Float[Tensor, "batch kv_pos d_model"]
        | Float[Tensor, "batch kv_pos head d_model"],
        past_kv_cache_entry: Any = None,
        additional_attention_mask: Tensor | None = None,
        attention_mask: Int[Tensor, "batch offset_pos"] | None = None,
        position_bias: Tensor | None = None,
    ) -> Float[Tensor, "batch pos d_model"]:
        """TL's call: the attention output `[batch pos d_model]` of one sublayer, causal,
        with `attention_mask` (1 = real token) over the past and new positions."""
        if additional_attention_mask is not None or position_bias is not None:
            raise ValueError(
                "additional_attention_mask and position_bias (T5, ALiBi models) are not "
                "supported: hookedattn's attention is causal with an optional padding mask"
            )
        batch, n_new = query_input.shape[:2]
        past = None
        if past_kv_cache_entry is not None:
            length = past_kv_cache_entry.past_keys.shape[1]
            seen = torch.ones(batch, length, dtype=torch.long, device=query_input.device)
            past = KeyValueCache([past_kv_cache_entry], seen)
        if attention_mask is not None and attention_mask.shape[1] != n_new:
            attention_mask = attention_mask[:, -n_new:]  # TL passes the whole row
        context = attention_context(
            self.cfg.n_ctx,
            batch,
            n_new,
            attention_mask,
            past,
            self.cfg.window_size if self.attn_type == "local" else None,
            query_input.device,
        )
        return super().forward(query_input, key_input, value_input, context, past_kv_cache_entry)

    @staticmethod
    def create_alibi_slope(
        n_ctx: int, device: str | torch.device | None = None
    ) -> Float[Tensor, "query_pos key_pos"]:
        """`min(key - query, 0)`: minus the distance back to each earlier key, 0 elsewhere."""
        positions = torch.arange(n_ctx, device=device, dtype=torch.float32)
        return (positions[None, :] - positions[:, None]).clamp(max=0)

    @staticmethod
    def create_alibi_multipliers(
        n_heads: int, device: str | torch.device | None = None
    ) -> Float[Tensor, " head"]:
        """ALiBi's slope per head: `2^(-8 h / n_heads)` for heads `h = 1..n_heads` (the
        paper's geometric sequence)."""
        heads = torch.arange(1, n_heads + 1, device=device, dtype=torch.float32)
        return 2.0 ** (-8.0 * heads / n_heads)

    @staticmethod
    def create_alibi_bias(
        n_heads: int, n_ctx: int, device: str | torch.device | None = None
    ) -> Float[Tensor, "head query_pos key_pos"]:
        """Each head's additive score penalty: its slope times `create_alibi_slope`."""
        slopes = AbstractAttention.create_alibi_multipliers(n_heads, device)
        return slopes[:, None, None] * AbstractAttention.create_alibi_slope(n_ctx, device)


class Attention(AbstractAttention):
    """TL's `Attention`: one key/value head per query head."""


class GroupedQueryAttention(AbstractAttention, _core.GroupedQueryAttention):
    """TL's `GroupedQueryAttention`: `n_key_value_heads` key/value heads, each serving
    `n_heads // n_key_value_heads` query heads (stored as `_W_K`, `_W_V`, `_b_K`, `_b_V`)."""
