"""Soft-capping: `cap * tanh(x / cap)` squashes attention scores or logits into (-cap, cap).

Gemma 2 caps its attention scores before the mask and its final logits; everywhere else
the cap is the identity.
"""

import torch
from torch import Tensor, nn

from hookedattn.core.components.norm import NoNorm


class SoftCap(nn.Module):
    """`cap * tanh(x / cap)`."""

    def __init__(self, cap: float) -> None:
        super().__init__()
        self.cap = cap

    def forward(self, x: Tensor) -> Tensor:
        return torch.tanh(x / self.cap) * self.cap


def make_soft_cap(cap: float | None) -> nn.Module:
    """A `SoftCap`, or the identity where the config sets no cap."""
    return NoNorm() if cap is None else SoftCap(cap)
