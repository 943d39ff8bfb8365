"""Multi-head latent attention (DeepSeek V2/V3, Kimi K2, Kimi Linear) with its heads split
over ranks.

The latents are shared by every head, and small: each rank computes them whole from the
whole stream (`W_Q_a`, `q_a_norm`, `W_KV_a`, `kv_a_norm`, the shared rotary key `W_K_rope`,
a lightning indexer's choice of keys, all replicated), and expands them into its own heads
only (`W_Q`, `W_KV_b` cut on the head axis), whose scores, pattern, `z` and write are
attention's on a rank (`HeadParallelAttention`: the writes summed over the ranks, `b_O`
once). So a head's q, k, v are exactly one process's, and the hook points of the latents
are whole on every rank.

Backwards, the ranks' gradients are summed where a replicated tensor enters the split
heads: the latents as the heads expand them, the shared rotary key as each head's keys
take it, the stream as an output gate reads it (`replicated_input`), not where the stream
enters the block, as a dense attention's are. So the gradient at a latent's hook point is
every head's, as in one process, and the stream's is counted once.
"""

import dataclasses

from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.parallel._collectives import replicated_input
from hookedattn.core.parallel._group import TensorParallelGroup
from hookedattn.core.parallel._sharding import (
    narrow_parameters,
    present,
    shard_hook_point,
    swap_class,
)
from hookedattn.core.parallel._sublayers import HeadParallelAttention

# The parameters cut on their head axis (0); every other one is whole on every rank.
_PER_HEAD = ("W_Q", "W_KV_b", "W_O", "W_G", "b_G")


class HeadParallelLatentAttention(HeadParallelAttention):
    """Latent attention holding this rank's heads: the latents whole, each entering the
    rank's heads here (module docstring)."""

    def per_head(
        self, latent: Float[Tensor, "batch pos rank"], W: Float[Tensor, "head rank d_out"]
    ) -> Float[Tensor, "batch pos head d_out"]:
        """This rank's heads' expansion of a latent (or of the stream)."""
        return super().per_head(replicated_input(latent, self.tp), W)

    def keys(
        self,
        k_nope: Float[Tensor, "batch pos head d_nope"],
        k_rope: Float[Tensor, "batch pos d_rope"],
    ) -> Float[Tensor, "batch pos head d_head"]:
        """This rank's heads' keys, each ending in the shared rotary key."""
        return super().keys(k_nope, replicated_input(k_rope, self.tp))

    def _gated(self, z: Tensor, x: Tensor) -> Tensor:
        """This rank's heads' `z`, each gated by its read of the stream."""
        return super()._gated(z, replicated_input(x, self.tp))


def shard_latent_attention(
    attn: nn.Module, cfg: HookedTransformerConfig, tp: TensorParallelGroup
) -> None:
    """Make latent attention hold this rank's heads, in place (module docstring)."""
    heads = tp.slice_of(cfg.n_heads, 0)
    narrow_parameters(attn, {name: heads for name in _PER_HEAD if name in present(attn)})
    swap_class(attn, HeadParallelLatentAttention)
    attn.tp, attn.kv_slice = tp, dataclasses.replace(heads, axis=2)
    if cfg.attn_gate is not None:
        attn.gated = attn._gated  # bound when built: bind the split one
    per_head = dataclasses.replace(heads, axis=2)
    for point in ("hook_q", "hook_k", "hook_v", "hook_rot_q", "hook_rot_k", "hook_attn_gate",
                  "hook_z", "hook_result"):  # fmt: skip
        shard_hook_point(attn, point, per_head, tp)
    for point in ("hook_attn_scores", "hook_pattern"):
        shard_hook_point(attn, point, dataclasses.replace(heads, axis=1), tp)
