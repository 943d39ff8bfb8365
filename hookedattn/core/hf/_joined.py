"""Live tensors a checkpoint keeps in pieces: OLMo Hybrid's gated delta net convolves
`[q; k; v]` with one depthwise `conv1d`, whose files keep it as `q_conv1d`, `k_conv1d`,
`v_conv1d` (`transformers` concatenates them on load). A depthwise convolution convolves
each channel alone, so the three are one convolution over the channels stacked, and our
`W_conv` is their rows, read as one tensor.

`_saved.renames` finds such a live tensor by value on the tiny twin and names it by its
pieces joined with `+` ("...q_conv1d.weight+...k_conv1d.weight+...v_conv1d.weight", in the
order whose rows make it); `joined` presents a source in which such a name is the pieces'
rows stacked, and the pieces themselves are read by it (so not unexpected).
"""

from collections.abc import Mapping
from typing import Any

import torch
from torch import Tensor

SEPARATOR = "+"


class _Joined:
    """`source` with each name of `joins` standing for its pieces' rows, one after another."""

    def __init__(self, source: Any, joins: Mapping[str, tuple[str, ...]]) -> None:
        self._source, self._joins = source, joins
        pieces = {piece for parts in joins.values() for piece in parts}
        self.shapes = {n: s for n, s in source.shapes.items() if n not in pieces}
        self.dtypes = {n: d for n, d in source.dtypes.items() if n not in pieces}
        for name, parts in joins.items():
            shapes = [tuple(source.shapes[p]) for p in parts]
            dtypes = {source.dtypes[p] for p in parts}
            if len({s[1:] for s in shapes}) != 1 or len(dtypes) != 1:
                raise ValueError(f"the pieces of {name} differ in shape or dtype: {shapes}")
            self.shapes[name] = (sum(s[0] for s in shapes), *shapes[0][1:])
            self.dtypes[name] = dtypes.pop()

    def get(self, name: str) -> Tensor:
        """The tensor called `name`; a joined name's pieces stacked along the rows."""
        parts = self._joins.get(name)
        if parts is None:
            return self._source.get(name)
        return torch.cat([self._source.get(p) for p in parts])


def joined(source: Any, table: Any) -> Any:
    """`source` as `table`'s rules read it: a name of pieces joined by `+` whose pieces are
    all present stands for their rows stacked; `source` itself where no rule reads one."""
    names = {hf for rule in table.rules for hf in rule.read_names() if SEPARATOR in hf}
    joins = {name: tuple(name.split(SEPARATOR)) for name in sorted(names)}
    joins = {name: parts for name, parts in joins.items()
             if all(p in source.shapes for p in parts)}  # fmt: skip
    return _Joined(source, joins) if joins else source
