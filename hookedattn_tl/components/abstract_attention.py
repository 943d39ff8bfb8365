"""TransformerLens's attention components with TL's constructors, over our attention.

`Attention(cfg)` (a config or a dict of its fields) is `hookedattn`'s attention sublayer,
initialised on its own (weights normal with standard deviation `cfg.init_range`, biases
zero) and runnable on its own: `attn(query_input, key_input, value_input)` builds the causal
(or windowed, or padded) masks itself, as TL's does. TL's internals are there for TL code
that reads them (`hookedattn_tl.components._internals`): `mask` (empty, as in TL 3.5: no
`n_ctx x n_ctx` mask is kept), `IGNORE`, the rotary tables with `apply_rotary` and
`calculate_sin_cos_rotary`, `apply_causal_mask`.

A component's config is its own copy, bound to it as a model's is (`hookedattn_tl.config`):
TL's run-time flag assignments, `attn.cfg.use_split_qkv_input = True` (likewise
`use_attn_in`, `use_attn_result`, `ungroup_grouped_query_attention`), rebuild the component
in place, keeping its parameters, buffers and hooks. `Attention` has one key/value head per
query head whatever `n_key_value_heads` says, as in TL. `AbstractAttention.create_alibi_slope` and
`create_alibi_bias` are ALiBi's distance penalties (Press et al. 2022), for code that
builds them; our models do not use ALiBi.
"""

import types
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from hookedattn.core import hook_points as _core_hooks
from hookedattn.core.components import attention as _core
from hookedattn.core.kernels import attention_context
from hookedattn.core.kv_cache import KeyValueCache
from hookedattn_tl.components import _ungrouped
from hookedattn_tl.components._internals import AttentionInternals
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


class AbstractAttention(AttentionInternals, _core.Attention):
    """Our attention sublayer with TL's constructor `(cfg, attn_type, layer_id)`, TL's
    standalone forward and internals; the ALiBi helpers as static methods."""

    def __init__(self, cfg: Any, attn_type: str = "global", layer_id: int | None = None):
        cfg = HookedTransformerConfig.unwrap(cfg)
        if attn_type not in ("global", "local"):
            raise ValueError(f"attn_type must be 'global' or 'local', got {attn_type!r}")
        # TL's Attention ignores n_key_value_heads; its GroupedQueryAttention reads it.
        grouped = isinstance(self, _core.GroupedQueryAttention)
        super().__init__(
            cfg if grouped else cfg.replace(n_key_value_heads=None),
            0 if layer_id is None else layer_id,
        )
        self.cfg = cfg.bound_to(self)
        self.layer_id = layer_id
        if attn_type == "local" and cfg.window_size is None:
            raise ValueError("attn_type='local' needs cfg.window_size")
        self.attn_type = attn_type
        if self.project_qkv == self._project_shared:
            # TL's standalone call takes three inputs: each projected from its own, as a
            # shortformer's are (the shared projection reads the query input only).
            self.project_qkv, self.input_pattern = self._project_each, _core._SHARED_IN
        _initialised(self, cfg)
        self._register_tl_buffers()
        for module in self.modules():
            if type(module) is _core_hooks.HookPoint:
                module.__class__ = HookPoint  # TL's hook API on the same hook points
        if grouped:  # (also a rebuild of an ungrouped one, which may turn the flag off)
            _ungrouped.set_ungrouped(self, cfg, cfg.ungroup_grouped_query_attention)

    # ------------------------------------------------------------------ TL's run-time flags
    def set_use_split_qkv_input(self, use_split_qkv_input: bool) -> None:
        """Take separate per-head query, key and value inputs (or one shared input)."""
        self._rebuild(use_split_qkv_input=use_split_qkv_input)

    def set_use_attn_in(self, use_attn_in: bool) -> None:
        """Take one input per head (or one shared input)."""
        self._rebuild(use_attn_in=use_attn_in)

    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """Add (or remove) the per-head `hook_result`."""
        self._rebuild(use_attn_result=use_attn_result)

    def set_ungroup_grouped_query_attention(self, ungroup_grouped_query_attention: bool) -> None:
        """Keys and values per query head (`hookedattn_tl.components._ungrouped`); stored
        only, on attention without grouped key/value heads."""
        self._rebuild(ungroup_grouped_query_attention=ungroup_grouped_query_attention)

    def set_use_hook_mlp_in(self, use_hook_mlp_in: bool) -> None:
        """Stored only: an attention component has no MLP input."""
        self._check_flags(use_hook_mlp_in=use_hook_mlp_in)
        self.cfg.set_in_place(use_hook_mlp_in=use_hook_mlp_in)

    def _check_flags(self, **flags: Any) -> None:
        for name, value in flags.items():
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}")

    def _rebuild(self, **changes: bool) -> None:
        """Become the component built from `cfg.replace(**changes)`, keeping this one's
        parameters, buffers, hooks and mode, and this config (changed in place)."""
        self._check_flags(**changes)
        cfg = self.cfg
        with torch.random.fork_rng(devices=[]):  # building draws weights; keep the RNG
            fresh = type(self)(cfg.replace(**changes), self.attn_type, self.layer_id)
        fresh.to(self.W_Q.device)
        parameters, buffers, training = dict(self._parameters), dict(self._buffers), self.training
        hooks = {
            name: [*point.fwd_hooks, *point.bwd_hooks]
            for name, point in self.named_modules()
            if isinstance(point, _core_hooks.HookPoint)
        }
        self.__class__ = type(fresh)
        self.__dict__.update(fresh.__dict__)
        for name, value in fresh.__dict__.items():  # the forward's chosen steps, as ours
            if isinstance(value, types.MethodType) and value.__self__ is fresh:
                self.__dict__[name] = types.MethodType(value.__func__, self)
        self._parameters.update(parameters)
        self._buffers.update(buffers)
        self.cfg = cfg
        cfg.set_in_place(**changes)
        self.train(training)
        points = dict(self.named_modules())
        for name, handles in hooks.items():
            for handle in handles if name in points else ():
                points[name].add_hook(handle.fn, handle.dir, handle.is_permanent)

    def forward(
        self,
        query_input: Float[Tensor, "batch pos d_model"] | Float[Tensor, "batch pos head d_model"],
        key_input: Float[Tensor, "batch kv_pos d_model"]
        | Float[Tensor, "batch kv_pos kv_head d_model"],
        value_input: Float[Tensor, "batch kv_pos d_model"]
        | Float[Tensor, "batch kv_pos kv_head d_model"],
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


class UngroupedGroupedQueryAttention(_ungrouped._Ungrouped, GroupedQueryAttention):
    """`GroupedQueryAttention` with TL's `ungroup_grouped_query_attention` on."""


_ungrouped.UNGROUPED[GroupedQueryAttention] = UngroupedGroupedQueryAttention
