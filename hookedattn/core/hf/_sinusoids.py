"""Fixed sinusoidal positions: a table the model computes from its sizes and adds to the
embedding, kept as a buffer no checkpoint holds (XGLM's `embed_positions.weights`, CTRL's
`pos_encoding`). Read into our learned positions' `W_pos`, computed here as the model
computes it (in float32, then cast), so its numbers are the buffer's.

Two tables are in use; both put the sines of every frequency first, then the cosines:

    "halves"   (tensor2tensor's; XGLM, from row 2 of its table): frequency i of
               d / 2 is `exp(-i log(10000) / (d / 2 - 1))`
    "pairs"    (the Transformer paper's angles, sines from the even dimensions, cosines from
               the odd ones; CTRL): dimension j's frequency is `1 / 10000 ** (2 (j // 2) / d)`

Which one a model uses is recognised on its twin: the buffer must equal one of them exactly.
"""

import dataclasses
import math
from collections.abc import Callable

import torch
from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf._table import Rule


def halves(rows: int, d_model: int) -> Float[Tensor, "rows d_model"]:
    """tensor2tensor's table (module docstring), in float32."""
    half = d_model // 2
    step = math.log(10000) / (half - 1)
    frequencies = torch.exp(torch.arange(half, dtype=torch.int64).float() * -step)
    angles = torch.arange(rows, dtype=torch.int64).float().unsqueeze(1) * frequencies.unsqueeze(0)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)
    if d_model % 2:  # an odd width's last dimension is 0
        table = torch.cat([table, torch.zeros(rows, 1)], dim=1)
    return table


def pairs(rows: int, d_model: int) -> Float[Tensor, "rows d_model"]:
    """The Transformer paper's angles, sines of the even dimensions then cosines of the odd
    ones (module docstring), in float32."""
    position = torch.arange(rows, dtype=torch.int64).float().unsqueeze(1)
    dim = torch.arange(d_model, dtype=torch.int64).float().unsqueeze(0)
    angles = position * (1 / torch.pow(10000, (2 * (dim // 2)) / d_model))
    return torch.cat([torch.sin(angles[:, 0::2]), torch.cos(angles[:, 1::2])], dim=-1)


TABLES: dict[str, Callable[[int, int], Tensor]] = {"halves": halves, "pairs": pairs}


@dataclasses.dataclass(frozen=True)
class Fixed:
    """A fixed table found: the buffer's name, the row of position 0, which table it is."""

    name: str
    offset: int
    kind: str


def found(added: Float[Tensor, "pos d_model"], base: nn.Module, prefix: str) -> Fixed | None:
    """The buffer of `base` (or of one of its children) whose consecutive rows are `added`
    (what was added to the embedding of positions 0, 1, ...), and which table it is; None
    if no buffer holds them. A buffer holding them that is neither table is a ValueError."""
    tolerance = 1e-6 * (float(added.abs().max()) + 1e-12)
    for name, buffer in base.named_buffers():
        if buffer.ndim != 2 or tuple(buffer.shape[1:]) != tuple(added.shape[1:]):
            continue
        weight = buffer.detach().float()
        for offset in range(weight.shape[0] - added.shape[0] + 1):
            if torch.allclose(weight[offset : offset + len(added)], added.float(), atol=tolerance):
                return Fixed(f"{prefix}.{name}".lstrip("."), offset, _kind(weight, offset, name))
    return None


def _kind(weight: Tensor, offset: int, name: str) -> str:
    rows, width = weight.shape
    for kind, table in TABLES.items():
        if torch.equal(table(rows, width)[offset:], weight[offset:]):
            return kind
    raise ValueError(f"the fixed positions {name} are none of the sinusoids we compute: "
                     f"{sorted(TABLES)}")  # fmt: skip


def position_rule(kind: str, offset: int, cfg: HookedTransformerConfig) -> Rule:
    """`W_pos`: rows `offset` to `offset + n_ctx` of the table `kind`, computed (no tensor
    of the checkpoint holds it)."""

    def table(zeros: Tensor) -> Tensor:
        return TABLES[kind](offset + cfg.n_ctx, cfg.d_model)[offset:].to(zeros.device)

    return Rule("pos_embed.W_pos", None, "-> n_ctx d_model", adjust=table)
