"""Queries, keys and values of one shared input by one product.

`q = x @ W_Q + b_Q`, `k = x @ W_K + b_K`, `v = x @ W_V + b_V` are three products over the
same `x`; laid side by side, `[W_Q W_K W_V]`, they are one, which is faster than three.

The side-by-side weight is where the attention's parameters live (`FusedQKV.tie`): one
`[(qkv_head d_head) d_model]` tensor, the layout `F.linear` multiplies fastest, and `W_Q`,
`W_K`, `W_V` (and the biases) views of it, as torch's recurrent layers keep cuDNN's flat
weights. A forward that records no gradient for them multiplies the tensor itself; an edit
of a parameter, in place, through `.data` or by loading a state dict, is an edit of it. A
parameter given other storage (`W.data = ...`, `load_state_dict(assign=True)`, a deep
copy) is no longer a view: the forward then lays the weights side by side afresh, as it
does wherever a gradient is recorded (so that it flows back to each parameter), and
inside `keeping()` keeps that copy while the weights are unchanged. Moving the module
(`.to`, `.double()`) ties the moved parameters again (`Attention._apply`).
"""

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.shapes import HeadVectors, KeyVectors, ValueVectors

# The weights in the order `project` takes them, after the input.
ORDER = ("W_Q", "b_Q", "W_K", "b_K", "W_V", "b_V")


class FusedQKV:
    """One attention layer's fused q/k/v product: its tied weights (`tie`), and its kept
    copy of untied ones while `keeping()`.

    A plain object, not a module: the parameters stay the attention's (and its state
    dict's); this holds the tensor they are views of, which is never saved on its own.
    """

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        self.d_head, self.d_value = cfg.d_head, cfg.d_value
        self.heads = (cfg.n_heads, cfg.n_kv_heads)
        self._keep = False
        self._kept: tuple[tuple, Tensor, Tensor] | None = None
        self._tied: tuple[list, Tensor, Tensor] | None = None

    def tie(self, params: tuple[nn.Parameter, ...]) -> None:
        """Make `params` (`W_Q, b_Q, W_K, b_K, W_V, b_V`, keys and values one per key/value
        head) views of one side-by-side weight and bias, their values unchanged."""
        if any(p.device.type == "meta" for p in params):
            self._tied = None  # nothing to lay out before `to_empty`
            return
        with torch.no_grad():
            W, b = _side_by_side(params)
        offset = 0
        for weight, bias in (params[0:2], params[2:4], params[4:6]):
            heads, d_model, d_head = weight.shape
            rows = heads * d_head
            # (head d_head) d_model -> head d_model d_head, a view
            weight.data = W[offset : offset + rows].view(heads, d_head, d_model).transpose(1, 2)
            bias.data = b[offset : offset + rows].view(heads, d_head)
            offset += rows
        self._tied = (_identity(params), W, b)

    def project(
        self,
        x: Float[Tensor, "batch pos d_model"],
        W_Q: Tensor,
        b_Q: Tensor,
        W_K: Tensor,
        b_K: Tensor,
        W_V: Tensor,
        b_V: Tensor,
    ) -> tuple[HeadVectors, KeyVectors, ValueVectors]:
        """`x @ W_Q + b_Q`, `x @ W_K + b_K`, `x @ W_V + b_V`, each split per head.

        The three are views of one result (`hook_q`, `hook_k`, `hook_v` read them at no
        cost, and they share one storage).
        """
        W, b = self.weights((W_Q, b_Q, W_K, b_K, W_V, b_V))
        qkv = nn.functional.linear(x, W, b)
        # batch pos (qkv_head d_head) -> three slices, not `split`: autograd lets a hook edit
        # a slice in place, but not one of the several views a single call returns; each
        # then split per head (the values' heads may be narrower, MiMo's). (Indexing, not
        # `narrow`: the same view, and fewer dispatcher calls at every decode step.)
        batch, pos, _ = qkv.shape
        n_q, n_kv = self.heads
        q_width, k_width = n_q * self.d_head, n_kv * self.d_head
        kv_end = q_width + k_width
        return (
            qkv[:, :, :q_width].view(batch, pos, n_q, self.d_head),
            qkv[:, :, q_width:kv_end].view(batch, pos, n_kv, self.d_head),
            qkv[:, :, kv_end:].view(batch, pos, n_kv, self.d_value),
        )

    def weights(
        self, params: tuple[Tensor, ...]
    ) -> tuple[Float[Tensor, "qkv d_model"], Float[Tensor, " qkv"]]:
        """`W_Q`, `W_K`, `W_V` and their biases side by side, laid out for one product.

        The tied tensors where the parameters are still their views and no gradient is
        recorded (module docstring). Otherwise a copy; inside `keeping()` the copy is reused
        while the weights are the same storage, unchanged (their version counters) and not
        differentiated (an edit through `.data` of such untied weights, which bypasses the
        version counter, is seen once the scope ends).
        """
        tracked = torch.is_grad_enabled() and any(p.requires_grad for p in params)
        tied = self._tied
        if not tracked and tied is not None and tied[0] == _identity(params):
            return tied[1], tied[2]
        if not self._keep:
            return _side_by_side(params)
        key = tuple((p.data_ptr(), p._version) for p in params)
        kept = self._kept
        if not tracked and kept is not None and kept[0] == key and kept[1].dtype == params[0].dtype:
            return kept[1], kept[2]
        W, b = _side_by_side(params)
        self._kept = None if tracked else (key, W, b)
        return W, b

    @contextlib.contextmanager
    def keeping(self) -> Iterator[None]:
        """Keep the side-by-side copy of untied weights between forwards in this scope,
        then free it."""
        self._keep = True
        try:
            yield
        finally:
            self._keep, self._kept = False, None


def _identity(params: tuple[Tensor, ...]) -> list:
    # Where each parameter's values are and how they are laid out: equal only while each
    # is still the view `tie` made (a parameter narrowed in place keeps its address but
    # not its shape).
    return [(p.data_ptr(), p.shape, p.stride(), p.dtype) for p in params]  # a list: no generator


def _side_by_side(params: tuple[Tensor, ...]) -> tuple[Tensor, Tensor]:
    # Query, key and value heads stacked as `[(qkv_head d_head) d_model]`, contiguous: the
    # weight `F.linear` takes as it is (its product runs a fifth faster from this layout
    # than from a transposed view at the 2-layer, d_model 64 bench shape).
    # head d_model d_head -> (head d_head) d_model, for W_Q, W_K, W_V in turn.
    W = torch.cat([W.transpose(1, 2).flatten(0, 1) for W in params[0::2]])
    return W, torch.cat([b.flatten() for b in params[1::2]])


@contextlib.contextmanager
def keeping_fused_weights(model: Any) -> Iterator[None]:
    """Within this scope, every attention layer of `model` keeps its fused q/k/v weights."""
    with contextlib.ExitStack() as stack:
        for module in model.modules():
            fused = getattr(module, "fused_qkv", None)
            if isinstance(fused, FusedQKV):
                stack.enter_context(fused.keeping())
        yield
