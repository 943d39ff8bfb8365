"""The second reference of `scripts/bench.py`: hookedattn's own math, without hook points.

Issue 2 asks what hook points cost over "a hook-free forward of the same weights". The
bare reference (`_bench_reference.BareTransformer`) answers a different question: it uses
`scaled_dot_product_attention` and a fused LayerNorm, other algorithms than ours, so its
ratio mixes the cost of the hooks with the cost of materialising the attention pattern.
This one computes what `HookedTransformer.forward` computes where hooks read the
attention scores and norms (the explicit `q k^T / scale + mask`, softmax, the unfused
LayerNorm, per-head weights in circuits notation), written as one would without hooks, checks
or a KV cache: standard positions and LN/LNPre/None norms, the configurations the bench
builds. Where no hook is attached, hookedattn runs fused kernels instead (equal to it to
float rounding).
"""

import math

import torch
import torch.nn.functional as F
from einops import einsum
from torch import Tensor

from hookedattn import HookedTransformer

# The patterns of `components/attention.py`: the same axis names give the same torch.einsum
# call (einops names the axes by letters in order of appearance, and that order decides
# how torch.einsum lays the product out), so the two forwards agree bit for bit.
_QKV = "batch pos d_model, head d_model d_head -> batch pos head d_head"
_SCORES = "batch query_pos head d_head, batch key_pos head d_head -> batch head query_pos key_pos"
_Z = "batch head query_pos key_pos, batch key_pos head d_head -> batch query_pos head d_head"
_OUT = "batch pos head d_head, head d_head d_model -> batch pos d_model"


class SameMathTransformer:
    """`HookedTransformer`'s forward with every hook point, check and option taken out."""

    def __init__(self, model: HookedTransformer) -> None:
        cfg = model.cfg
        if cfg.positional_embedding_type == "rotary" or cfg.normalization_type not in (
            "LN",
            "LNPre",
            None,
        ):
            raise NotImplementedError(
                f"the same-math reference supports standard/none positions and LN/LNPre/None "
                f"norms, not {cfg.positional_embedding_type}/{cfg.normalization_type}"
            )
        if cfg.use_attn_result or cfg.use_split_qkv_input or cfg.use_attn_in:
            raise NotImplementedError("the same-math reference has no per-head hook inputs")
        self.cfg = cfg
        self.sd = {k: v.detach() for k, v in model.state_dict().items()}
        self.blocked = torch.ones(cfg.n_ctx, cfg.n_ctx, dtype=torch.bool, device=cfg.device).triu(1)
        self.act = {
            "gelu": F.gelu,
            "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
            "relu": F.relu,
            "silu": F.silu,
        }[cfg.act_fn]

    def norm(self, x: Tensor, prefix: str) -> Tensor:
        if self.cfg.normalization_type is None:
            return x
        x = x - x.mean(-1, keepdim=True)
        scale = (x.pow(2).mean(-1, keepdim=True) + self.cfg.eps).sqrt()
        if self.cfg.normalization_type == "LNPre":
            return x / scale
        return x / scale * self.sd[prefix + "w"] + self.sd[prefix + "b"]

    def attention(self, x: Tensor, p: str, mask: Tensor) -> Tensor:
        w = self.sd
        q = einsum(x, w[p + "W_Q"], _QKV) + w[p + "b_Q"]
        k = einsum(x, w[p + "W_K"], _QKV) + w[p + "b_K"]
        v = einsum(x, w[p + "W_V"], _QKV) + w[p + "b_V"]
        scores = einsum(q / self.cfg.attn_scale, k, _SCORES) + mask
        z = einsum(scores.softmax(dim=-1), v, _Z)
        return einsum(z, w[p + "W_O"], _OUT) + w[p + "b_O"]

    def mlp(self, x: Tensor, p: str) -> Tensor:
        w = self.sd
        post = self.act(F.linear(x, w[p + "W_in"].T, w[p + "b_in"]))
        return F.linear(post, w[p + "W_out"].T, w[p + "b_out"])

    def __call__(self, tokens: Tensor) -> Tensor:
        cfg, w = self.cfg, self.sd
        pos = tokens.shape[1]
        resid = F.embedding(tokens, w["embed.W_E"])
        if cfg.positional_embedding_type == "standard":
            resid = resid + w["pos_embed.W_pos"][:pos]
        blocked = self.blocked[:pos, :pos]
        mask = torch.zeros(blocked.shape, dtype=resid.dtype, device=resid.device)
        mask = mask.masked_fill_(blocked, -math.inf)
        for i in range(cfg.n_layers):
            p = f"blocks.{i}."
            resid = resid + self.attention(self.norm(resid, p + "ln1."), p + "attn.", mask)
            if not cfg.attn_only:
                resid = resid + self.mlp(self.norm(resid, p + "ln2."), p + "mlp.")
        resid = self.norm(resid, "ln_final.")
        return F.linear(resid, w["unembed.W_U"].T, w["unembed.b_U"])
