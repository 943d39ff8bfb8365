"""Rotary positions computed once outside the layers and handed to each (RoFormer's).

RoFormer adds no positions to the stream: its encoder looks up the rows of the positions
in a table of sinusoids (`encoder.embed_positions`, a frozen `nn.Embedding` each checkpoint
saves though nothing trains it) and passes them to every layer, whose attention rotates its
queries and keys by them. A row holds the sines of each rotated pair's angle, then the
cosines, over the head's width `d`, pair i turning at `10000 ** (-2i / d)`: our rotary of
base 10000 over the whole head, in whichever layout (halves or neighbouring pairs) the
verification finds computes what `transformers` computes (RoFormer's: pairs `(2i, 2i + 1)`).

Recognised on the twin's run (`_split_layers`): a table outside the layers, `d_head` wide,
whose rows are among what the first layer was handed. The table must hold those sinusoids
(else a ValueError naming it); its weight is then left out of the import, our rotary
computing the same angles.
"""

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

BASE = 10000.0


def handed_table(seen: dict[str, Any], handed: list[Tensor], d_head: int) -> str | None:
    """The table (of the `table:{name}` outputs in `seen`) whose output, `d_head` wide, is
    among the tensors `handed` to the first layer; None where there is none. One that is
    not a rotary's sinusoids (module docstring) is a ValueError naming it."""
    for key, (_, rows) in seen.items():
        if not key.startswith("table:") or rows.shape[-1] != d_head:
            continue
        if any(_same_rows(tensor, rows) for tensor in handed):
            name = key.removeprefix("table:")
            _check_sinusoids(name, rows.reshape(-1, d_head))
            return name
    return None


def sinusoids(positions: int, d_head: int) -> Float[Tensor, "pos d_head"]:
    """The sines of each pair's angle, then the cosines (module docstring), float64."""
    pairs = torch.arange(d_head // 2, dtype=torch.float64)
    frequencies = BASE ** (-2 * pairs / d_head)
    angles = torch.arange(positions, dtype=torch.float64)[:, None] * frequencies
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def refuse_rotated_values(hf_config: Any) -> None:
    """A ValueError where the config asks for the values rotated too (RoFormer's
    `rotary_value=True`): our attention rotates queries and keys only."""
    if getattr(hf_config, "rotary_value", False):
        raise ValueError(
            "rotary_value=True (the values rotated by their positions too, as queries and "
            "keys are) is not imported: our rotary rotates queries and keys only"
        )


def _same_rows(tensor: Tensor, rows: Tensor) -> bool:
    """Whether `tensor` holds the rows `rows` (as handed on: with leading axes of one)."""
    return tensor.numel() == rows.numel() and torch.equal(tensor.reshape(rows.shape), rows)


def _check_sinusoids(name: str, rows: Float[Tensor, "pos d_head"]) -> None:
    # The table's rows are those of positions 0, 1, ... (the twin's one forward from 0).
    # transformers computes them in float64 and saves them in float32: hence the tolerance.
    want = sinusoids(rows.shape[0], rows.shape[-1])
    if rows.shape[-1] % 2 or not torch.allclose(rows.double(), want, rtol=0, atol=1e-6):
        raise ValueError(
            f"{name} hands the layers sinusoids that are not a rotary's of base {BASE:g} over "
            f"the head's {rows.shape[-1]} dimensions (the sines of each pair, then the "
            "cosines): not imported"
        )
