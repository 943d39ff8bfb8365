"""TransformerLens 3.x's direct path patching: one head's write, patched into one later head's
query, key or value input only (TL's `tools.analysis.direct_path_patching`).

For a source head A and a destination head B in a later layer, the difference A makes to
the stream, `delta = (z_clean[A] - z_corrupted[A]) @ W_O[A]`, is added to B's input of the
corrupted run through B's read, linearised at the corrupted run's norm scale:
`q_B += (delta / scale_ln1) @ W_Q[B]` (or `W_K`, `W_V`). Every other reader of the stream
still sees A's corrupted write. The linearisation leaves out the norm's centring and gain,
so it is exact for a model whose norms are folded (`from_pretrained`, `process_weights_()`);
on another model `_check_fold_ln` warns. One forward per destination head, as in TL.
"""

import warnings
from collections.abc import Callable
from typing import Any, Literal

import torch
from jaxtyping import Float
from torch import Tensor

Component = Literal["q", "k", "v"]


def _check_fold_ln(model: Any) -> None:
    """Warn (UserWarning) when block 0's norm has a gain other than ones: the linearisation
    assumes folded norms. A model without such a norm is not checked."""
    try:
        gain = getattr(model.blocks[0].ln1, "w", None)
    except (AttributeError, TypeError, IndexError):
        return
    if isinstance(gain, Tensor) and not torch.allclose(gain, torch.ones_like(gain), atol=1e-3):
        warnings.warn(
            "get_act_patch_direct_path is exact only for folded norms: load with "
            "from_pretrained (fold_ln=True) or call model.process_weights_() first",
            UserWarning,
            stacklevel=3,
        )


def _head_write(
    model: Any, cache: Any, layer: int, head: int
) -> Float[Tensor, "batch pos d_model"]:
    """Head `head` of block `layer`'s write to the stream, `z[head] @ W_O[head]`."""
    return cache[f"blocks.{layer}.attn.hook_z"][:, :, head] @ model.blocks[layer].attn.W_O[head]


def get_act_patch_direct_path(
    model: Any,
    corrupted_tokens: Tensor,
    clean_cache: Any,
    corrupted_cache: Any,
    patching_metric: Callable[[Tensor], Tensor],
    src_layer: int,
    src_head: int,
    component: Component = "q",
    verbose: bool = True,
) -> Float[Tensor, "layer head"]:
    """`[dst_layer, dst_head]`: the metric with the direct path from head
    `(src_layer, src_head)` into each later head's `component` input patched; 0 for
    heads at or before `src_layer` (no path). `verbose` is accepted (TL's progress bar)."""
    if component not in ("q", "k", "v"):
        raise ValueError(f"component must be 'q', 'k' or 'v', got {component!r}")
    _check_fold_ln(model)
    cfg = model.cfg
    results = torch.zeros(cfg.n_layers, cfg.n_heads, device=cfg.device)
    delta = _head_write(model, clean_cache, src_layer, src_head)
    delta = delta - _head_write(model, corrupted_cache, src_layer, src_head)
    for layer in range(src_layer + 1, cfg.n_layers):
        read = getattr(model.blocks[layer].attn, f"W_{component.upper()}")
        scale = corrupted_cache[f"blocks.{layer}.ln1.hook_scale"]
        for head in range(cfg.n_heads):
            added = (delta / scale) @ read[head]
            hook = _AddToHead(head, added)
            logits = model.run_with_hooks(
                corrupted_tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_{component}", hook)]
            )
            results[layer, head] = float(patching_metric(logits))
    return results


class _AddToHead:
    """A hook adding `added` `[batch pos d_head]` to one head of `[batch pos head d_head]`."""

    def __init__(self, head: int, added: Tensor) -> None:
        self.head, self.added = head, added

    def __call__(self, value: Tensor, hook: Any) -> Tensor:
        value = value.clone()
        value[:, :, self.head] = value[:, :, self.head] + self.added.to(value.dtype)
        return value


def get_act_patch_direct_path_all_sources(
    model: Any,
    corrupted_tokens: Tensor,
    clean_cache: Any,
    corrupted_cache: Any,
    patching_metric: Callable[[Tensor], Tensor],
    component: Component = "q",
    verbose: bool = True,
) -> Float[Tensor, "src_layer src_head layer head"]:
    """`get_act_patch_direct_path` from every source head: `[src_layer src_head layer head]`."""
    cfg = model.cfg
    results = torch.zeros(cfg.n_layers, cfg.n_heads, cfg.n_layers, cfg.n_heads, device=cfg.device)
    for layer in range(cfg.n_layers):
        for head in range(cfg.n_heads):
            results[layer, head] = get_act_patch_direct_path(
                model,
                corrupted_tokens,
                clean_cache,
                corrupted_cache,
                patching_metric,
                layer,
                head,
                component,
                verbose=False,
            )
    return results


__all__ = ["get_act_patch_direct_path", "get_act_patch_direct_path_all_sources"]
