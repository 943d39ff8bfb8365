"""Top activations of transcoder features over an activation store: what a graph page
shows when a feature is hovered.

    examples = feature_examples(store, transcoders, [(1, 42), (0, 7)], model=model)
    examples["1_42"]   # [{"activation": 3.1, "tokens": [...], "position": 7}, ...]

The store must hold each layer's transcoder input (`blocks.L.ln2.hook_out`); every row is
encoded (the whole layer: a TopK feature is active only among the layer's largest), the
`n` largest activations of each feature are kept, and each comes with the `context` tokens
up to and including its own, from the same context (`store.origin`).
"""

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float, Int
from torch import Tensor

from hookedattn.sae.transcoder_set import TranscoderSet


@torch.no_grad()
def feature_examples(
    store: Any,
    transcoders: Any,
    features: Sequence[tuple[int, int]],
    *,
    n: int = 5,
    context: int = 12,
    model: Any = None,
    batch_size: int = 8192,
) -> dict[str, list[dict[str, Any]]]:
    """The `n` top activations of each `(layer, feature)` over `store` (module docstring),
    keyed `"layer_feature"`; tokens as text through `model`'s tokenizer, else as ids."""
    tset = TranscoderSet(transcoders)
    wanted: dict[int, list[int]] = {}
    for layer, feature in features:
        if layer not in tset.layers or not 0 <= feature < tset.d_sae(layer):
            raise ValueError(f"no feature {feature} at layer {layer} in {tset}")
        wanted.setdefault(layer, []).append(feature)
    out = {}
    for layer, chosen in wanted.items():
        chosen = sorted(set(chosen))
        values, rows = _top_rows(store, tset, layer, chosen, n, batch_size)
        for j, feature in enumerate(chosen):
            keep = values[:, j] > 0
            out[f"{layer}_{feature}"] = [
                _example(store, int(row), float(value), context, model)
                for value, row in zip(values[keep, j], rows[keep, j], strict=True)
            ]
    return out


def _top_rows(
    store: Any, tset: TranscoderSet, layer: int, chosen: list[int], n: int, batch_size: int
) -> tuple[Float[Tensor, "top feature"], Int[Tensor, "top feature"]]:
    """The `n` largest activations `[n feature]` of the `chosen` features and their rows."""
    best = torch.zeros(0, len(chosen), dtype=tset.dtype)
    best_rows = torch.zeros(0, len(chosen), dtype=torch.long)
    start = 0
    for batch in store.batches(tset.input_hook(layer), batch_size):
        acts = tset.encode(layer, batch.to(tset.dtype))[:, chosen]
        rows = torch.arange(start, start + len(batch))[:, None].expand_as(acts)
        start += len(batch)
        values = torch.cat([best, acts])
        index = torch.cat([best_rows, rows])
        top = values.topk(min(n, len(values)), dim=0)
        best, best_rows = top.values, index.gather(0, top.indices)
    return best, best_rows


def _example(store: Any, row: int, value: float, context: int, model: Any) -> dict[str, Any]:
    position = int(store.origin(row).position)
    first = row - min(position, context - 1)
    ids = store.origin(torch.arange(first, row + 1)).token.tolist()
    if model is not None and getattr(model, "tokenizer", None) is not None:
        tokens = [str(s) for s in model.to_str_tokens(torch.tensor(ids))]
    else:
        tokens = [str(i) for i in ids]
    return {"activation": value, "tokens": tokens, "position": len(ids) - 1}
