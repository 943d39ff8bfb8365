"""Queries, keys and values of one shared input by one product.

`q = x @ W_Q + b_Q`, `k = x @ W_K + b_K`, `v = x @ W_V + b_V` are three products over the
same `x`; laid side by side, `[W_Q W_K W_V]`, they are one, which is faster than three.
The side-by-side copy of the weights is built by each forward (small beside the product for
many tokens); inside `keeping()` (generation, where one token's product is as cheap as the
copy) it is kept between forwards while the weights are unchanged.
"""

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.shapes import HeadVectors, KeyVectors


class FusedQKV:
    """One attention layer's fused q/k/v product, and its kept weights while `keeping()`.

    A plain object, not a module: it holds no parameters, only (inside `keeping()`) a
    derived copy of the attention's, which is never saved.
    """

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        self.d_head = cfg.d_head
        n_q, n_kv = cfg.n_heads * cfg.d_head, cfg.n_kv_heads * cfg.d_head
        self.widths = (n_q, n_kv, n_kv)
        self.heads = (cfg.n_heads, cfg.n_kv_heads)
        self._keep = False
        self._kept: tuple[tuple, Tensor, Tensor] | None = None

    def project(
        self,
        x: Float[Tensor, "batch pos d_model"],
        W_Q: Tensor,
        b_Q: Tensor,
        W_K: Tensor,
        b_K: Tensor,
        W_V: Tensor,
        b_V: Tensor,
    ) -> tuple[HeadVectors, KeyVectors, KeyVectors]:
        """`x @ W_Q + b_Q`, `x @ W_K + b_K`, `x @ W_V + b_V`, each split per head.

        The three are views of one result (`hook_q`, `hook_k`, `hook_v` read them at no
        cost, and they share one storage).
        """
        W, b = self.weights((W_Q, W_K, W_V, b_Q, b_K, b_V))
        qkv = nn.functional.linear(x, W, b)
        # batch pos (qkv_head d_head) -> batch pos qkv_head d_head, then three slices of the
        # heads (`narrow`), not `split`: autograd lets a hook edit a slice in place, but not
        # one of the several views a single call returns.
        batch, pos, _ = qkv.shape
        heads = qkv.view(batch, pos, -1, self.d_head)
        n_q, n_kv = self.heads
        return (
            heads.narrow(2, 0, n_q),
            heads.narrow(2, n_q, n_kv),
            heads.narrow(2, n_q + n_kv, n_kv),
        )

    def weights(
        self, params: tuple[Tensor, ...]
    ) -> tuple[Float[Tensor, "qkv d_model"], Float[Tensor, " qkv"]]:
        """`W_Q`, `W_K`, `W_V` (and their biases) side by side, laid out for one product.

        Inside `keeping()` the copy is reused while the weights are the same storage,
        unchanged (their version counters) and not being differentiated: an edit of a
        weight, in place or by assignment, is seen by the next forward. (An edit through
        `.data`, which bypasses the version counter, is seen once the scope ends.)
        """
        if not self._keep:
            return _side_by_side(params)
        tracked = torch.is_grad_enabled() and any(p.requires_grad for p in params)
        key = tuple((p.data_ptr(), p._version) for p in params)
        kept = self._kept
        if not tracked and kept is not None and kept[0] == key and kept[1].dtype == params[1].dtype:
            return kept[1], kept[2]
        W, b = _side_by_side(params)
        self._kept = None if tracked else (key, W, b)
        return W, b

    @contextlib.contextmanager
    def keeping(self) -> Iterator[None]:
        """Keep the side-by-side weights between forwards in this scope, then free them."""
        self._keep = True
        try:
            yield
        finally:
            self._keep, self._kept = False, None


def _side_by_side(params: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
    # Query, key and value heads side by side as `[d_model (head d_head)]`, returned
    # transposed (a view) as `F.linear` takes it. Copying whole `d_head` rows this way
    # copies contiguous memory, where `[(head d_head) d_model]` would transpose every head;
    # the product is as fast from either layout.
    # head d_model d_head -> d_model head d_head (views), then d_model (head d_head).
    W = torch.cat([W.permute(1, 0, 2) for W in params[:3]], dim=1).flatten(1)
    return W.T, torch.cat(params[3:]).flatten()


@contextlib.contextmanager
def keeping_fused_weights(model: Any) -> Iterator[None]:
    """Within this scope, every attention layer of `model` keeps its fused q/k/v weights."""
    with contextlib.ExitStack() as stack:
        for module in model.modules():
            fused = getattr(module, "fused_qkv", None)
            if isinstance(fused, FusedQKV):
                stack.enter_context(fused.keeping())
        yield
