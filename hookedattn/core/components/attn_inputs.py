"""How the residual stream enters a block's attention: its query, key and value inputs.

One shared normed copy of the stream for all three; or (TransformerLens's `use_attn_in`)
a copy per head, or (`use_split_qkv_input`) separate copies for the queries, keys and
values, each behind its own hook point so that one head's input can be patched alone; in a
shortformer model the query and key inputs gain the positional embedding.
"""

from einops import rearrange, repeat
from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.core import _variants
from hookedattn.core.components.attention import AttnInput
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.kernels import AttentionContext
from hookedattn.core.shapes import Resid


class AttnInputs:
    """The residual stream as the attention's query, key and value inputs, through `ln1`.

    One shared normed copy; or (`use_attn_in`) one copy per head behind `hook_attn_in`; or
    (`use_split_qkv_input`) separate copies for queries, keys and values behind
    `hook_q_input`, `hook_k_input`, `hook_v_input` (keys and values: one per key/value
    head). Per-head copies are new tensors, so an in-place edit of one never reaches the
    stream. In a shortformer model the query and key inputs then gain the positional
    embedding the context carries (each head's copy the same one). A plain object, not a
    module: the hook points and the norm belong to the block, where TransformerLens names
    them, and the block hands itself to each call (kept here, it would make the block a
    reference cycle: `_variants`).
    """

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        self.n_heads, self.n_kv_heads = cfg.n_heads, cfg.n_kv_heads
        per_head = cfg.use_split_qkv_input or cfg.use_attn_in
        if cfg.use_split_qkv_input:
            self.inputs = self._split
        elif cfg.use_attn_in:
            self.inputs = self._per_head
        else:
            self.inputs = self._shared
        self.positions = _without_positions
        if cfg.positional_embedding_type == "shortformer":
            self.positions = self._with_query_key_positions
            # One positional embedding for every head's copy of the input.
            self.pos_layout = (
                "batch pos d_model -> batch pos 1 d_model"
                if per_head
                else "batch pos d_model -> batch pos d_model"
            )
        _variants.keep_on_classes([self])  # the choice on a class: no cycle through self

    def __call__(
        self, block: nn.Module, resid: Resid, context: AttentionContext
    ) -> tuple[AttnInput, AttnInput, AttnInput]:
        """The query, key and value inputs of `block` (`inputs` and `positions` are chosen
        when the block is built)."""
        return self.positions(*self.inputs(block, resid), context)

    def _shared(self, block: nn.Module, resid: Resid) -> tuple[AttnInput, AttnInput, AttnInput]:
        x = block.ln1(resid)
        return x, x, x

    def _per_head(self, block: nn.Module, resid: Resid) -> tuple[AttnInput, AttnInput, AttnInput]:
        x = block.ln1(block.hook_attn_in(_copies(resid, self.n_heads)))
        return x, x, x

    def _split(self, block: nn.Module, resid: Resid) -> tuple[AttnInput, AttnInput, AttnInput]:
        q_in = block.ln1(block.hook_q_input(_copies(resid, self.n_heads)))
        k_in = block.ln1(block.hook_k_input(_copies(resid, self.n_kv_heads)))
        v_in = block.ln1(block.hook_v_input(_copies(resid, self.n_kv_heads)))
        return q_in, k_in, v_in

    def _with_query_key_positions(
        self, q_in: AttnInput, k_in: AttnInput, v_in: AttnInput, context: AttentionContext
    ) -> tuple[AttnInput, AttnInput, AttnInput]:
        """Shortformer: the positional embedding added to the (normed) query and key inputs,
        not to the values."""
        pos_embed = self.position_embedding(context)
        return q_in + pos_embed, k_in + pos_embed, v_in

    def position_embedding(self, context: AttentionContext) -> AttnInput:
        """The positional embedding the query and key inputs gain, laid out to add to them."""
        return rearrange(context.pos_embed, self.pos_layout)


def _without_positions(
    q_in: AttnInput, k_in: AttnInput, v_in: AttnInput, context: AttentionContext
) -> tuple[AttnInput, AttnInput, AttnInput]:
    """The inputs as they are: the queries and keys read no positional embedding here."""
    return q_in, k_in, v_in


def _copies(resid: Resid, n: int) -> Float[Tensor, "batch pos head d_model"]:
    # `repeat` returns a broadcast view of `resid` (stride 0 over heads); without the
    # clone an in-place edit of one head's input would write into the stream itself.
    return repeat(resid, "batch pos d_model -> batch pos head d_model", head=n).clone()
