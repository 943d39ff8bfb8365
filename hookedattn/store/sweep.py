"""`sweep`: any per-batch function of a model over a dataset, each rank a share of the batches.

    result = sweep(model, lambda m, pair: patch(m, *pair), pairs, out="sweep.safetensors")

`fn(model, batch)` returns a tensor or a dict of tensors whose first axis is the batch
(for example the per-prompt numbers of an activation-patching run, with the prompt axis
moved first). Under `torchrun` rank r takes batches r, r + world_size, ...; rank 0 gathers
every share, puts them back in dataset order and saves them with their labels.
"""

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import safetensors
import safetensors.torch
import torch
import torch.distributed as dist
from jaxtyping import Int
from torch import Tensor

from hookedattn.store import _distributed
from hookedattn.store._files import commit, file_metadata, read_file_metadata, temporary_name


@dataclasses.dataclass(frozen=True)
class SweepResult:
    """`values[key]` is `[item ...]`: one row per dataset item in `items`, named by `labels`."""

    values: dict[str, Tensor]
    labels: tuple[str, ...]
    items: Int[Tensor, " item"]


def sweep(
    model: Any,
    fn: Callable[[Any, Any], Tensor | dict[str, Tensor]],
    dataset: Sequence,
    *,
    batch_size: int = 8,
    labels: Sequence[str] | None = None,
    collate: Callable[[list], Any] | None = None,
    out: str | Path | None = None,
) -> SweepResult:
    """Run `fn(model, batch)` over `dataset` in batches of `batch_size`, shared among ranks.

    `collate` turns a list of items into a batch (default: tensors stacked, tuples and
    dicts of tensors stacked field by field). Rank 0 returns every item in dataset order
    and writes `out` (safetensors, labels in its metadata) if given; other ranks return
    their own share.
    """
    labels = tuple(str(i) for i in range(len(dataset))) if labels is None else tuple(labels)
    if len(labels) != len(dataset):
        raise ValueError(f"{len(labels)} labels for {len(dataset)} items")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    collate = _stack if collate is None else collate
    ranks = _distributed.current_rank()
    starts = range(0, len(dataset), batch_size)
    local = []
    for b in ranks.share(len(starts)):
        items = range(starts[b], min(starts[b] + batch_size, len(dataset)))
        result = _as_dict(fn(model, collate([dataset[i] for i in items])), len(items))
        local.append((b, result))
    shares = [local]
    if ranks.world_size > 1:
        shares = [None] * ranks.world_size if ranks.is_main else None
        dist.gather_object(local, shares, dst=0)
        if not ranks.is_main:
            shares = [local]
    merged = sorted((pair for share in shares for pair in share), key=lambda pair: pair[0])
    if not merged:
        raise ValueError("the dataset is empty: nothing to sweep")
    index = torch.cat(
        [torch.arange(starts[b], starts[b] + len(next(iter(r.values())))) for b, r in merged]
    )
    values = {k: torch.cat([r[k] for _, r in merged]) for k in merged[0][1]}
    result = SweepResult(values, tuple(labels[i] for i in index.tolist()), index)
    if out is not None and ranks.is_main:
        save_sweep(result, out)
    _distributed.barrier()
    return result


def save_sweep(result: SweepResult, out: str | Path) -> Path:
    """Write a `SweepResult` as safetensors (labels and items in the metadata), atomically."""
    final = Path(out)
    tmp = temporary_name(final)
    metadata = file_metadata({"labels": result.labels, "items": result.items.tolist()})
    tensors = {k: v.contiguous() for k, v in result.values.items()}
    try:
        safetensors.torch.save_file(tensors, str(tmp), metadata=metadata)
        commit(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    return final


def load_sweep(path: str | Path) -> SweepResult:
    """Read back what `sweep(..., out=path)` wrote."""
    try:
        with safetensors.safe_open(str(path), framework="pt") as f:
            metadata = read_file_metadata(f.metadata())
            if "labels" not in metadata or "items" not in metadata:
                raise ValueError(f"{path} is not a saved sweep (no labels in its metadata)")
            values = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 (no __iter__)
    except safetensors.SafetensorError as error:
        raise ValueError(f"{path} is not a saved sweep: not a safetensors file ({error})") from None
    labels = tuple(metadata["labels"])
    return SweepResult(values, labels, torch.tensor(metadata["items"], dtype=torch.long))


def _as_dict(result: Any, n_items: int) -> dict[str, Tensor]:
    result = {"values": result} if isinstance(result, Tensor) else result
    if not isinstance(result, dict) or not all(isinstance(v, Tensor) for v in result.values()):
        raise TypeError(
            f"fn must return a tensor or a dict of tensors, got {type(result).__name__}"
        )
    for key, value in result.items():
        if value.ndim == 0 or value.shape[0] != n_items:
            raise ValueError(
                f"fn's {key!r} has shape {tuple(value.shape)}: its first axis must "
                f"be the batch ({n_items} items)"
            )
    return {k: v.detach().cpu() for k, v in result.items()}


def _stack(items: list) -> Any:
    first = items[0]
    if isinstance(first, Tensor):
        return torch.stack(items)
    if isinstance(first, tuple | list):
        return tuple(torch.stack(column) for column in zip(*items, strict=True))
    if isinstance(first, dict):
        return {k: torch.stack([item[k] for item in items]) for k in first}
    return items
