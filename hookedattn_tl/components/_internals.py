"""TransformerLens's attention internals, for TL code that calls or loads them directly.

TL's attention keeps derived state that ours computes per forward: the causal mask (an
empty `mask` buffer in TL 3.5), `IGNORE` (the `-inf` a blocked score becomes), and a
rotary model's `rotary_sin` / `rotary_cos`, the sines and cosines of the first
`min(n_ctx, 2048)` positions, grown on demand (`apply_rotary`: to twice the size, or what
is needed, at most `n_ctx`). These are the same buffers and methods over our equations:
the frequencies are `hookedattn.core.components.rotary`'s (the layer's own, local or
global), the rotation is our `Rotary.rotate`, and the causal and windowed masks are the
core's (`kernels.rows_context`). One rule is TL's own: `apply_causal_mask` with an
`attention_mask` blocks every padding key, a padding query's own included (our forward
lets a padding query read itself, so that no row of its pattern is empty).

Loading a state dict keeps these buffers where a saved one has another shape (TL 2.x saved
an `n_ctx x n_ctx` mask and full-length rotary tables): they follow from the config.
"""

from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from hookedattn.core.components.rotary import Rotary
from hookedattn.core.kernels import rows_context

# TL's initial rotary table length: a long-context model does not pay for n_ctx rows.
ROTARY_INITIAL_CACHE_SIZE = 2048
_DERIVED = ("mask", "rotary_sin", "rotary_cos")


class AttentionInternals:
    """`IGNORE`, `mask`, the rotary tables and the methods TL code reads them with; for a
    subclass of our `Attention` with TL's `cfg` and `attn_type`."""

    ROTARY_INITIAL_CACHE_SIZE = ROTARY_INITIAL_CACHE_SIZE

    def _register_tl_buffers(self) -> None:
        device = self.W_Q.device
        self.register_buffer("mask", torch.empty(0, 0, dtype=torch.bool, device=device))
        self.register_buffer("IGNORE", torch.tensor(-torch.inf, device=device))
        if self.cfg.positional_embedding_type == "rotary":
            # The layer's own rotation: a local layer's frequencies where it has them.
            self.rotary = Rotary(self.cfg, local=self.attn_type == "local").to(device)
            size = min(self.cfg.n_ctx, ROTARY_INITIAL_CACHE_SIZE)
            sin, cos = self.calculate_sin_cos_rotary(
                self.cfg.rotary_dim, size, self._rotary_base(), self.cfg.dtype
            )
            self.register_buffer("rotary_sin", sin)
            self.register_buffer("rotary_cos", cos)

    def _rotary_base(self) -> float:
        """The base of this layer's frequencies: `rotary_base_local` in a local layer that
        has one, else `rotary_base`."""
        if self.attn_type == "local" and self.cfg.rotary_base_local is not None:
            return self.cfg.rotary_base_local
        return self.cfg.rotary_base

    def calculate_sin_cos_rotary(
        self,
        rotary_dim: int,
        n_ctx: int,
        base: float | int = 10000,
        dtype: torch.dtype = torch.float32,
    ) -> tuple[Float[Tensor, "n_ctx rotary_dim"], Float[Tensor, "n_ctx rotary_dim"]]:
        """`(sin, cos)` of positions `0..n_ctx-1`: this layer's rotation with `rotary_dim`
        rotated dimensions and frequency base `base` (its scaling as the config says)."""
        local = self.attn_type == "local"
        own_base = local and self.cfg.rotary_base_local is not None
        field = "rotary_base_local" if own_base else "rotary_base"
        cfg = self.cfg.replace(rotary_dim=rotary_dim, **{field: float(base)})
        positions = torch.arange(n_ctx, device=self.W_Q.device)[None, :]
        cos, sin = Rotary(cfg, local=local).to(self.W_Q.device).cos_sin(positions, dtype)
        return sin[0, :, 0], cos[0, :, 0]

    def _extend_rotary_embeddings(self, new_size: int) -> None:
        """Recompute the rotary tables for positions `0..new_size-1`."""
        self.rotary_sin, self.rotary_cos = self.calculate_sin_cos_rotary(
            self.cfg.rotary_dim, new_size, self._rotary_base(), self.cfg.dtype
        )

    def apply_rotary(
        self,
        x: Float[Tensor, "batch pos head d_head"],
        past_kv_pos_offset: int = 0,
        attention_mask: Int[Tensor, "batch offset_pos"] | None = None,
    ) -> Float[Tensor, "batch pos head d_head"]:
        """`x` (queries or keys at positions from `past_kv_pos_offset`; with a 0/1
        `attention_mask` over past and new positions, counting real tokens only) rotated
        by the tables, grown first if they are too short."""
        n_new = x.shape[1]
        needed = past_kv_pos_offset + n_new
        if needed > self.cfg.n_ctx:
            raise ValueError(
                f"positions up to {needed - 1} (past_kv_pos_offset={past_kv_pos_offset}, "
                f"{n_new} new) exceed the model's n_ctx={self.cfg.n_ctx}"
            )
        if needed > self.rotary_cos.shape[0]:
            self._extend_rotary_embeddings(
                min(self.cfg.n_ctx, max(needed, 2 * self.rotary_cos.shape[0]))
            )
        device = self.rotary_cos.device
        if attention_mask is None:
            attention_mask = torch.ones(1, needed, dtype=torch.long, device=device)
        queries = torch.arange(past_kv_pos_offset, needed, device=device)
        positions = rows_context(attention_mask.to(device), queries, None).positions
        cos, sin = self.rotary_cos[positions][:, :, None], self.rotary_sin[positions][:, :, None]
        return self.rotary.rotate(x.to(device), cos.to(x.dtype), sin.to(x.dtype))

    def apply_causal_mask(
        self,
        attn_scores: Float[Tensor, "batch head query_pos key_pos"],
        past_kv_pos_offset: int = 0,
        attention_mask: Int[Tensor, "batch key_pos"] | None = None,
    ) -> Float[Tensor, "batch head query_pos key_pos"]:
        """The scores with `IGNORE` where a query (at positions from `past_kv_pos_offset`)
        may not read a key: later keys, keys outside a local layer's window, and padding
        keys (`attention_mask == 0`)."""
        n_queries, n_keys = attn_scores.shape[-2:]
        device = attn_scores.device
        queries = torch.arange(past_kv_pos_offset, past_kv_pos_offset + n_queries, device=device)
        every_key = torch.ones(1, n_keys, dtype=torch.long, device=device)
        window = self.cfg.window_size if self.attn_type == "local" else None
        blocked = rows_context(every_key, queries, window).blocked[self.attn_type]
        if attention_mask is not None:
            blocked = blocked | (attention_mask.to(device) == 0)[:, None, None, :]
        return torch.where(blocked, self.IGNORE.to(device, attn_scores.dtype), attn_scores)

    def _load_from_state_dict(
        self, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        # The derived buffers keep their own shape (module docstring).
        for name in _DERIVED:
            saved, current = state_dict.get(prefix + name), getattr(self, name, None)
            both = isinstance(saved, Tensor) and isinstance(current, Tensor)
            if both and saved.shape != current.shape:
                state_dict = {**state_dict, prefix + name: current}
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
