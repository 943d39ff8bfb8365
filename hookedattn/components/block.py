"""Transformer blocks: the residual-stream equations, one sublayer at a time.

Each sublayer reads the residual stream (through a norm) and adds what it writes back:

    resid_mid  = resid_pre + attn(ln1(resid_pre))
    resid_post = resid_mid + mlp(ln2(resid_mid))

An attention-only block has no MLP and no `resid_mid`. Which per-head input hook points
exist (`hook_q_input`..., `hook_attn_in`, `hook_mlp_in`) is decided when the block is built.
"""

from einops import repeat
from jaxtyping import Float, Int
from torch import Tensor, nn

from hookedattn.components.attention import Attention, AttnInput
from hookedattn.components.mlp import MLP
from hookedattn.components.norm import make_norm
from hookedattn.config import HookedTransformerConfig
from hookedattn.hook_points import HookPoint
from hookedattn.kv_cache import KeyValueCacheEntry

Resid = Float[Tensor, "batch pos d_model"]


class AttnOnlyBlock(nn.Module):
    """`resid_post = resid_pre + attn(ln1(resid_pre))`."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        # Modules are registered in the order the forward reaches them, so that
        # `hook_dict` lists hook points in that order too.
        self.n_heads = cfg.n_heads
        self.hook_resid_pre = HookPoint()
        if cfg.use_split_qkv_input:
            self.hook_q_input = HookPoint()  # [batch pos head d_model]
            self.hook_k_input = HookPoint()
            self.hook_v_input = HookPoint()
            self.attn_inputs = self._split_inputs
        elif cfg.use_attn_in:
            self.hook_attn_in = HookPoint()  # [batch pos head d_model]
            self.attn_inputs = self._per_head_input
        else:
            self.attn_inputs = self._shared_input
        self.ln1 = make_norm(cfg)
        self.attn = Attention(cfg)
        self.hook_attn_out = HookPoint()
        self.hook_resid_post = HookPoint()

    def forward(
        self,
        resid_pre: Resid,
        mask: Float[Tensor, "#batch 1 query_pos key_pos"],
        positions: Int[Tensor, "batch pos"],
        past_kv: KeyValueCacheEntry | None = None,
    ) -> Resid:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self.hook_attn_out(
            self.attn(*self.attn_inputs(resid_pre), mask, positions, past_kv)
        )
        return self.hook_resid_post(resid_pre + attn_out)

    # The residual stream as q/k/v input: one shared copy, or one per head so that each
    # head's input can be patched on its own (the per-head copies are new tensors, so an
    # in-place edit of one never reaches the stream).
    def _shared_input(self, resid: Resid) -> tuple[AttnInput, AttnInput, AttnInput]:
        x = self.ln1(resid)
        return x, x, x

    def _per_head_input(self, resid: Resid) -> tuple[AttnInput, AttnInput, AttnInput]:
        x = self.ln1(self.hook_attn_in(self._copy_per_head(resid)))
        return x, x, x

    def _split_inputs(self, resid: Resid) -> tuple[AttnInput, AttnInput, AttnInput]:
        q_in = self.ln1(self.hook_q_input(self._copy_per_head(resid)))
        k_in = self.ln1(self.hook_k_input(self._copy_per_head(resid)))
        v_in = self.ln1(self.hook_v_input(self._copy_per_head(resid)))
        return q_in, k_in, v_in

    def _copy_per_head(self, resid: Resid) -> Float[Tensor, "batch pos head d_model"]:
        # `repeat` returns a broadcast view of `resid` (stride 0 over heads); without the
        # clone an in-place edit of one head's input would write into the stream itself.
        return repeat(
            resid, "batch pos d_model -> batch pos head d_model", head=self.n_heads
        ).clone()


class Block(AttnOnlyBlock):
    """`resid_mid = resid_pre + attn(ln1(resid_pre))`, `resid_post = resid_mid + mlp(ln2(...))`."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__(cfg)
        self.hook_resid_mid = HookPoint()
        if cfg.use_hook_mlp_in:
            self.hook_mlp_in = HookPoint()
            self.mlp_input = self._hooked_mlp_input
        else:
            self.mlp_input = self._mlp_input
        self.ln2 = make_norm(cfg)
        self.mlp = MLP(cfg)
        self.hook_mlp_out = HookPoint()
        # Re-register so that resid_post comes last, where the forward reaches it.
        self.hook_resid_post = self._modules.pop("hook_resid_post")

    def forward(
        self,
        resid_pre: Resid,
        mask: Float[Tensor, "#batch 1 query_pos key_pos"],
        positions: Int[Tensor, "batch pos"],
        past_kv: KeyValueCacheEntry | None = None,
    ) -> Resid:
        resid_pre = self.hook_resid_pre(resid_pre)
        attn_out = self.hook_attn_out(
            self.attn(*self.attn_inputs(resid_pre), mask, positions, past_kv)
        )
        resid_mid = self.hook_resid_mid(resid_pre + attn_out)
        mlp_out = self.hook_mlp_out(self.mlp(self.mlp_input(resid_mid)))
        return self.hook_resid_post(resid_mid + mlp_out)

    def _mlp_input(self, resid_mid: Resid) -> Resid:
        return self.ln2(resid_mid)

    def _hooked_mlp_input(self, resid_mid: Resid) -> Resid:
        # A copy: an in-place edit of the MLP's input must not reach the stream's skip path.
        return self.ln2(self.hook_mlp_in(resid_mid.clone()))
