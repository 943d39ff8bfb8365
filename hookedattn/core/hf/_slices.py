"""Reading part of one of our tensors from the HF tensor it is converted from: only the
bytes that part needs.

A rule's pattern names every axis of both sides (`"(head d_head) d_model -> head d_model
d_head"`), so a range of one of our axes (a rank's heads, a chunk of the vocabulary) is a
set of runs along the HF tensor's dimensions: `head` 4..7 of `(head d_head)` is rows
`4*d_head .. 8*d_head`; of GPT-NeoX's interleaved `(head qkv d_head)`, with the query part
picked, one run of `d_head` rows per head. Those runs are read from the safetensors file
(`get_slice`, memory-mapped), cast, and converted with the pattern at the part's sizes.

A large tensor is read in chunks along the HF tensor's first axis, each copied into its
place in the finished tensor before the next is mapped: a bfloat16 checkpoint loads with
the finished model plus one chunk resident, never a float32 copy, and a rank of a
tensor-parallel job reads only its slices.

A mixture of experts' rule (`experts=n`, one HF tensor per expert) is read expert by
expert into our stacked tensor, one expert's tensor held at a time.
"""

import dataclasses
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf._joined import joined
from hookedattn.core.hf._loading import SafetensorsFiles
from hookedattn.core.hf._table import (
    Rule,
    Table,
    TensorSource,
    constant,
    our_shape,
    plus_first_row,
    reshaped,
    sizes_by_rule,
)

Ranges = Mapping[str, tuple[int, int]]
# A chunk of this many bytes (of the finished tensor) is read at a time: small beside a
# model, large enough that a 100M model opens its file a few hundred times at most.
CHUNK_BYTES = 4 << 20
# A dimension cut into more runs than this (an interleaved part picked out of every row, as
# GPT-OSS's `(d_mlp gate_up)`) is read as the span of its runs, the runs then taken in
# memory: a few bytes more read, rather than one mapped region per run.
MAX_RUNS = 16


def _groups(side: str) -> list[list[str]]:
    """Each dimension of one side of a pattern as its axis names: `"(head d_head) d_model"`
    -> `[["head", "d_head"], ["d_model"]]`."""
    return [(g[0] or g[1]).split() for g in re.findall(r"\(([^)]*)\)|(\S+)", side)]


def _runs(names: Sequence[str], sizes: Mapping[str, int], ranges: Ranges) -> list[tuple[int, int]]:
    """The `(start, stop)` runs along one dimension made of the axes `names` (outermost
    first) that hold the indices `ranges` selects of each axis (all of an axis it omits)."""
    extents = [sizes[n] for n in names]
    chosen = [ranges.get(n, (0, sizes[n])) for n in names]
    cut = [i for i, (c, n) in enumerate(zip(chosen, extents, strict=True)) if c != (0, n)]
    if not cut:
        return [(0, math.prod(extents))]
    last = cut[-1]
    inner = math.prod(extents[last + 1 :])
    length = (chosen[last][1] - chosen[last][0]) * inner
    strides = [math.prod(extents[i + 1 :]) for i in range(len(extents))]
    starts = [chosen[last][0] * inner]
    for i in range(last - 1, -1, -1):  # every combination of the outer axes' indices
        low, high = chosen[i]
        starts = [k * strides[i] + s for k in range(low, high) for s in starts]
    return [(s, s + length) for s in sorted(starts)]


def _in_pieces(runs: list[tuple[int, int]], pieces: list[int], part: int) -> list[tuple[int, int]]:
    """Runs along piece `part` (as if alone) as rows of the whole dimension: the pieces one
    after another, repeated (a rule's `split_within`) as often as the runs reach."""
    size, total, offset = pieces[part], sum(pieces), sum(pieces[:part])
    rows = []
    for a, b in runs:  # cut at each repeat's end, each cut moved to its repeat's rows
        if a == b:  # an empty run (a rank's share of nothing) stays empty, in the part
            rows.append((a + offset, b + offset))
        while a < b:
            repeat, stop = a // size, min(b, (a // size + 1) * size)
            shift = repeat * (total - size) + offset
            rows.append((a + shift, stop + shift))
            a = stop
    merged = rows[:1]
    for a, b in rows[1:]:
        merged[-1:] = [(merged[-1][0], b)] if a == merged[-1][1] else [merged[-1], (a, b)]
    return merged


def read_regions(source: TensorSource, name: str, regions: list[tuple[slice, ...]]) -> list[Tensor]:
    """The tensor `name` at each of `regions` (basic slices, one per dimension)."""
    if isinstance(source, SafetensorsFiles):
        return source.read_regions(name, regions)
    whole = source.get(name)
    return [whole[region] for region in regions]


def _read_runs(source: TensorSource, name: str, runs: list[list[tuple[int, int]]]) -> Tensor:
    """The runs of every dimension, read (one region per combination) and joined."""
    picked = {d: r for d, r in enumerate(runs) if len(r) > MAX_RUNS}
    spans = [[(r[0][0], r[-1][1])] if d in picked else r for d, r in enumerate(runs)]
    combos: list[list[tuple[int, int]]] = [[]]
    for dim_runs in spans:
        combos = [[*c, r] for c in combos for r in dim_runs]
    regions = [tuple(slice(a, b) for a, b in combo) for combo in combos]
    parts = read_regions(source, name, regions)
    # Joined innermost dimension first: the combinations vary fastest in the last.
    for dim in range(len(spans) - 1, -1, -1):
        n = len(spans[dim])
        if n > 1:
            parts = [torch.cat(parts[i : i + n], dim=dim) for i in range(0, len(parts), n)]
    (tensor,) = parts
    for dim, dim_runs in picked.items():
        first = dim_runs[0][0]
        index = torch.cat([torch.arange(a - first, b - first) for a, b in dim_runs])
        tensor = tensor.index_select(dim, index)
    return tensor


def read_rule(
    rule: Rule,
    source: TensorSource,
    stored: str | None,
    sizes: Mapping[str, int],
    ranges: Ranges,
    dtype: torch.dtype,
    device: str | torch.device,
    out: Tensor | None = None,
) -> Tensor:
    """Our tensor of `rule` with each axis in `ranges` cut to its `(start, stop)`, read from
    the HF tensor `stored` (None for a rule of zeros), in `dtype` on `device`, in memory of
    its own; or copied into `out` (then returned), with no tensor made in between where
    the stored dtype is `dtype`."""
    ranges = dict(ranges)
    local = {n: ranges[n][1] - ranges[n][0] if n in ranges else s for n, s in sizes.items()}
    if rule.hf is None:
        return constant(rule, our_shape(rule, local), dtype, device)
    hf_side, our_side = rule.pattern.split("->")
    if rule.pick is not None:  # only the picked part of the fused axis is read
        (fused,) = _groups(our_side)[0]
        ranges[fused], local[fused] = (rule.pick, rule.pick + 1), 1
    runs = [_runs(names, sizes, ranges) for names in _groups(hf_side)]
    if rule.split is not None:  # this part's rows follow the parts before it
        pieces = [math.prod(sizes[n] for n in piece.split()) for piece in rule.split]
        runs[0] = _in_pieces(runs[0], pieces, rule.part)
    read = _read_runs(source, stored, runs)
    tensor = read.to(device=device, dtype=dtype)
    used = set(re.findall(r"\w+", rule.pattern))
    tensor = reshaped(tensor, rule.pattern, {n: s for n, s in local.items() if n in used})
    if rule.pick is not None:
        tensor = tensor[0]
    if rule.adjust is not None:
        tensor = rule.adjust(tensor).to(dtype)
    if out is not None:
        return out.copy_(tensor)
    tensor = tensor.contiguous()
    if tensor.untyped_storage().data_ptr() == read.untyped_storage().data_ptr():
        tensor = tensor.clone()  # never a view of a mapped file or of a live model's tensor
    return tensor


def read_rule_in_chunks(
    rule: Rule,
    source: TensorSource,
    stored: str | None,
    sizes: Mapping[str, int],
    ranges: Ranges,
    dtype: torch.dtype,
    device: str | torch.device,
    chunk_bytes: int = CHUNK_BYTES,
) -> Tensor:
    """`read_rule`, a chunk of the HF tensor's first axis at a time when the tensor is
    larger than `chunk_bytes`, each chunk copied into the finished tensor."""
    local = {n: ranges[n][1] - ranges[n][0] if n in ranges else s for n, s in sizes.items()}
    shape = our_shape(rule, local)
    n_bytes = math.prod(shape) * dtype.itemsize
    where = None if rule.hf is None else _chunk_axis(rule)
    if n_bytes <= chunk_bytes or where is None:
        return read_rule(rule, source, stored, sizes, ranges, dtype, device)
    axis, dim = where
    low, high = ranges.get(axis, (0, sizes[axis]))
    step = max(1, chunk_bytes // max(1, n_bytes // max(1, high - low)))
    out = torch.empty(shape, dtype=dtype, device=device)
    for start in range(low, high, step):
        stop = min(start + step, high)
        chunk = {**ranges, axis: (start, stop)}
        into = out.narrow(dim, start - low, stop - start)
        read_rule(rule, source, stored, sizes, chunk, dtype, device, out=into)
    return out


def _chunk_axis(rule: Rule) -> tuple[str, int] | None:
    """The outermost axis of the HF tensor's first dimension, and the dimension of ours it
    is, where it is one of ours on its own (else None: the tensor is read whole)."""
    hf_side, our_side = rule.pattern.split("->")
    if not _groups(hf_side):  # a scalar (xIELU's beta): nothing to chunk
        return None
    axis = _groups(hf_side)[0][0]
    ours = _groups(our_side)[1 if rule.pick is not None else 0 :]
    return next(((axis, d) for d, names in enumerate(ours) if names == [axis]), None)


def table_reader(table: Table, source: TensorSource, cfg: HookedTransformerConfig):
    """`read(name, local_slice, device)` for `parallel.build_model`: our tensor `name` (a
    rule of `table`), cut to `local_slice` if given, in `cfg.dtype`, read from `source`."""
    rules = {rule.ours: rule for rule in table.rules}
    source = joined(source, table)  # a tensor kept in pieces read as one (`_joined`)
    stored = table.source_names(source.shapes)
    sizes_of = sizes_by_rule(cfg)  # a block's own heads and widths, where blocks differ

    def read(name: str, local_slice: Any, device: str) -> Tensor:
        rule = rules[name]
        sizes = sizes_of(rule)
        if rule.experts:  # one HF tensor per expert, stacked in ours
            return _read_experts(rule, source, stored, sizes, local_slice, cfg.dtype, device)
        ranges = {}
        if local_slice is not None:
            ranges = _our_range(rule, local_slice.axis, local_slice, sizes)
        hf = stored.get(rule.hf)
        tensor = read_rule_in_chunks(rule, source, hf, sizes, ranges, cfg.dtype, device)
        return plus_first_row(rule, tensor, source, stored, ranges.get("d_model"))

    return read


def _read_experts(
    rule: Rule,
    source: TensorSource,
    stored: Mapping[str, str],
    sizes: Mapping[str, int],
    local_slice: Any,
    dtype: torch.dtype,
    device: str | torch.device,
) -> Tensor:
    """Our stacked tensor of an `experts=n` rule (`[expert ...]`), each expert read from
    its own HF tensor (`{expert}` in the rule's name); `local_slice` may cut the expert
    axis (axis 0: a rank's experts) or an axis of each expert's tensor."""
    one = dataclasses.replace(rule, experts=0)
    experts, ranges = (0, rule.experts), {}
    if local_slice is not None and local_slice.axis == 0:
        experts = (local_slice.start, local_slice.stop)
    elif local_slice is not None:
        ranges = _our_range(one, local_slice.axis - 1, local_slice, sizes)
    local = {n: ranges[n][1] - ranges[n][0] if n in ranges else s for n, s in sizes.items()}
    out = torch.empty((experts[1] - experts[0], *our_shape(one, local)), dtype=dtype, device=device)
    for e in range(*experts):  # one expert's tensor held at a time
        hf = stored[rule.hf.replace("{expert}", str(e))]
        out[e - experts[0]] = read_rule_in_chunks(one, source, hf, sizes, ranges, dtype, device)
    return out


def _our_range(rule: Rule, dim: int, part: Any, sizes: Mapping[str, int]) -> dict:
    """`{axis: (start, stop)}`: the range `part` cuts of our tensor's dimension `dim` in
    `rule` (after a pick), on that dimension's outermost axis where it is made of several
    (a rank's heads of `(group d_state)`: whole groups, `start` and `stop` multiples of
    `d_state`)."""
    ours = _groups(rule.pattern.split("->")[1])[1 if rule.pick is not None else 0 :]
    outer, *inner = ours[dim]
    width = math.prod(sizes[name] for name in inner)
    if part.start % width or part.stop % width:
        raise ValueError(
            f"{rule.ours}: a part {part.start}..{part.stop} of ({' '.join(ours[dim])}) that "
            f"does not keep each {outer} whole ({width} wide)"
        )
    return {outer: (part.start // width, part.stop // width)}
