"""A hybrid whose mixer layers place their norms otherwise than its attention layers.

OLMo Hybrid norms what its attention writes, OLMo 2's way (`post_attention_layernorm`,
`post_feedforward_layernorm`: our `ln1_post`, `ln2_post`), but the input of its gated
delta nets and of the MLP after them (`input_layernorm`, `post_attention_layernorm`: our
`ln1`, `ln2`), Qwen3-Next's way. The anatomy reads the attention layer's norms off the first
layer that attends; where the first mixer layer holds norms of other names or shapes, its
norms are read here the same way, by following the tensors its twin's run passed
(`_wiring`), and become our `placement_layers`: each block's placement on its own. The
mixer layers' writes must be scaled as the attention layers' are, and their norms of the
model's one kind and epsilon; anything else is a ValueError naming it.
"""

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from hookedattn.core.hf._probes import norm_kind
from hookedattn.core.hf._roles import is_norm
from hookedattn.core.hf._watching import _first_output, _first_tensor
from hookedattn.core.hf._wiring import placement, wiring

_TOKENS = (2, 7)


def read(
    twin: nn.Module,
    layers: tuple[list[nn.Module], list[int]],
    mixer: str,
    mlp: str,
    attention: tuple[list[tuple[str, str]], tuple[float, float]],
    norms_of: tuple[tuple[str, bool, float], tuple[float, ...]],
) -> tuple[tuple[str, str], ...] | None:
    """The norms of the mixer layers (ours, the layer's child) where they differ from the
    attention layers' (`layers`: the twin's layers and which of them attend, a mixer and
    the attention may share a name, RecurrentGemma's `temporal_block`; `attention`: the
    attention layers' norms and the writes' scales); None where the
    first mixer layer holds norms of the same names and shapes. `norms_of`: the model's
    norm kind, bias and epsilon, and the epsilons to try."""
    attn_norms, writes = attention
    layers, attends = layers
    holders = [layer for i, layer in enumerate(layers) if i not in attends]
    attending = layers[attends[0]]
    if not holders or _norm_shapes(holders[0]) == _norm_shapes(attending):
        return None
    if not mlp:
        raise ValueError(
            "a mixer layer whose norms differ from the attention layers' and whose MLP is "
            "the layer's own maps: not recognised"
        )
    layer = holders[0]
    names = [n for n, m in layer.named_children() if is_norm(m)]
    norms, parallel, scales = wiring(_calls(twin, layer), mixer, mlp, names)
    where = placement({ours for ours, _ in norms})
    if parallel or where == "post_residual":
        raise ValueError(
            f"a mixer layer of {'parallel' if parallel else where} norms: only pre, post or "
            "pre-and-post norms in a sequential block are recognised"
        )
    if not all(abs(s - w) <= 1e-6 * max(1.0, abs(w)) for s, w in zip(scales, writes, strict=True)):
        raise ValueError(
            f"the mixer layers scale their writes by {scales}, the attention layers by "
            f"{writes}: not recognised"
        )
    kind, epsilons = norms_of
    found = norm_kind([layer.get_submodule(hf) for _, hf in norms], epsilons)
    if found != kind:
        raise ValueError(f"the mixer layers' norms are {found}, the attention layers' {kind}")
    if sorted(norms) == sorted(attn_norms):
        return None
    return tuple(norms)


def placements(anatomy: Any, kinds: tuple[str, ...]) -> dict[str, Any]:
    """Our `placement_layers` for blocks of `kinds` (a hybrid's per block), where the mixer
    layers' norms differ from the attention layers' (`read`); else nothing."""
    if anatomy.mixer_norms is None:
        return {}
    mixing = placement({ours for ours, _ in anatomy.mixer_norms})
    return {"placement_layers": tuple(anatomy.placement if kind == "attention" else mixing
                                      for kind in kinds)}  # fmt: skip


def norms_by_layer(anatomy: Any, kinds: tuple[str, ...]) -> list[tuple[list[int], tuple]]:
    """Each set of blocks and the norms they hold (ours, the layer's child): all blocks the
    attention layers' norms, or those and the mixer layers' apart (`read`)."""
    if anatomy.mixer_norms is None:
        return [(list(range(len(kinds))), anatomy.norms)]
    attending = [i for i, kind in enumerate(kinds) if kind == "attention"]
    mixing = [i for i, kind in enumerate(kinds) if kind != "attention"]
    return [(attending, anatomy.norms), (mixing, anatomy.mixer_norms)]


def _calls(twin: nn.Module, layer: nn.Module) -> list[tuple[str, Tensor, Tensor]]:
    """The calls of `layer` (its own first) and its children, (name, input, output), as the
    twin runs on a few random tokens; an output changed in place after its call is kept as
    it was made (`_watching`'s way), the others as the very tensors passed on (`_wiring`
    follows them by identity)."""
    calls: list[tuple[str, Tensor, Tensor]] = []
    made: list[tuple[int, Tensor]] = []

    def hook(name: str) -> Callable[..., None]:
        def record(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            y = _first_output(output)
            calls.append((name, _first_tensor(args, kwargs), y))
            made.append((y._version, y.clone()))

        return record

    handles = [layer.register_forward_hook(hook(""), with_kwargs=True)]
    handles += [m.register_forward_hook(hook(n), with_kwargs=True)
                for n, m in layer.named_children()]  # fmt: skip
    vocab = twin.get_input_embeddings().weight.shape[0]
    tokens = torch.randint(0, vocab, _TOKENS, generator=torch.Generator().manual_seed(1))
    try:
        with torch.no_grad():
            twin(tokens)
    finally:
        for handle in handles:
            handle.remove()
    calls = [(n, x, y if y._version == version else values)
             for (n, x, y), (version, values) in zip(calls, made, strict=True)]  # fmt: skip
    return [calls[-1], *calls[:-1]]  # the layer's own hook runs after its children's


def _norm_shapes(layer: nn.Module) -> dict[str, tuple[int, ...]]:
    return {n: tuple(m.weight.shape) if getattr(m, "weight", None) is not None else ()
            for n, m in layer.named_children() if is_norm(m)}  # fmt: skip
