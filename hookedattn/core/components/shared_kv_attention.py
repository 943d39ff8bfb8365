"""Attention that reads the keys and values of an earlier block (Gemma 4's
`num_kv_shared_layers`: `cfg.n_kv_shared_layers`, `cfg.kv_source_layer`).

The last `n_kv_shared_layers` blocks compute queries alone; each reads the keys and values
of the last block before them of its own attention type (its source, block `S`), as that
block's heads read them (after its key norm, rotation and value norm, a KV cache's
positions first), which block `S` leaves in the forward's context (`Attention.share`):

    q       = rotary(q_norm(x @ W_Q + b_Q))          (hook_q, hook_rot_q: this block's own)
    k, v    = block S's                              (blocks.S.attn.hook_k, hook_v, ...)
    z       = softmax(q k^T / attn_scale) @ v        (hook_attn_scores, hook_pattern, hook_z)
    out     = sum_h z_h @ W_O[h] + b_O               (hook_result)

So a shared block has `hook_q`, `hook_rot_q`, `hook_attn_scores`, `hook_pattern`, `hook_z`
and `hook_result` of its own, and no `hook_k`, `hook_v`, `hook_rot_k`, `k_norm`, `v_norm`,
`W_K`, `W_V`, `b_K`, `b_V`: its keys and values are block `S`'s, so an edit at block `S`'s
`hook_k` or `hook_v` reaches every block reading them, as it does in the model. Reading
its `W_K` (a QK circuit, the stacked `model.W_K`) is refused by name. With a KV cache it
reads block `S`'s entry through the context and its own entry stays empty (no second copy).

The scores, pattern and write are `Attention`'s own (`kernels.attend`, `write`).
"""

from torch import Tensor

from hookedattn.core import kernels
from hookedattn.core.components.attention import Attention, AttnInput
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.kernels import AttentionContext
from hookedattn.core.kv_cache import KeyValueCacheEntry
from hookedattn.core.shapes import HeadVectors, KeyValues, Values

# What a shared block does not have: its keys' and values' hook points and norms.
_NOT_ITS_OWN = ("hook_k", "hook_v", "hook_rot_k", "k_norm", "v_norm")


class SharedKVAttention(Attention):
    """Block `layer`'s attention over the keys and values of block
    `cfg.kv_source_layer(layer)` (module docstring)."""

    def __init__(self, cfg: HookedTransformerConfig, layer: int = 0) -> None:
        super().__init__(cfg, layer)
        self.source = cfg.kv_source_layer(layer)
        for name in _NOT_ITS_OWN:
            if hasattr(self, name):
                delattr(self, name)
        self.k_before = self.k_after = None

    def _init_key_value_weights(self, cfg: HookedTransformerConfig) -> None:
        """None: the keys and values are the source block's."""

    def _tie_fused_weights(self) -> None:
        """Nothing to tie: the queries are this block's only product."""

    def key_value_weights(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Refused: a ValueError naming the block whose keys and values these are."""
        raise ValueError(
            f"this attention reads the keys and values of block {self.source} "
            f"(n_kv_shared_layers): it has no W_K, b_K, W_V, b_V of its own; read "
            f"blocks[{self.source}].attn's, which read block {self.source}'s stream"
        )

    W_K = property(lambda self: self.key_value_weights()[0], doc="Refused (module docstring).")
    b_K = property(lambda self: self.key_value_weights()[1], doc="Refused (module docstring).")
    W_V = property(lambda self: self.key_value_weights()[2], doc="Refused (module docstring).")
    b_V = property(lambda self: self.key_value_weights()[3], doc="Refused (module docstring).")

    def scored(self, q: HeadVectors, k: Tensor, context: AttentionContext) -> None:
        """Refused: a ValueError naming the block whose keys these are."""
        raise ValueError(
            f"this attention's keys are block {self.source}'s (n_kv_shared_layers), "
            f"normed and rotated by blocks[{self.source}].attn: score them from there"
        )

    def forward(
        self,
        query_input: AttnInput,
        key_input: AttnInput,
        value_input: AttnInput,
        context: AttentionContext,
        past_kv: KeyValueCacheEntry | None = None,
    ) -> Tensor:
        """The module docstring's equations; `key_input`, `value_input` and `past_kv` (this
        block's own, empty, entry) are not read."""
        q = self.project_queries(query_input)
        q = self.q_after(self.position_queries(self.q_before(self.hook_q(q)), context))
        k, v = self.source_keys_and_values(context, q.device)
        z = kernels.attend(self, q, k, self.read_values(v), context)
        return self.write(self.hook_z(self.gated(z, query_input)))

    def source_keys_and_values(
        self, context: AttentionContext, device: object
    ) -> tuple[KeyValues, Values]:
        """The keys and values block `source` left in `context`; a ValueError where it did
        not run in this forward (a forward from a later block: `start_at_layer`)."""
        kept = context.shared_kv.get(self.attn_type)
        if kept is None:
            raise ValueError(
                f"this block reads the keys and values of block {self.source} "
                f"(n_kv_shared_layers), which did not run in this forward: start at block "
                f"{self.source} or earlier (start_at_layer)"
            )
        k, v = kept
        return k.to(device), v.to(device)
