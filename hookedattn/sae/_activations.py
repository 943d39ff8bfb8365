"""The activation functions of a sparse autoencoder, one small module each.

Chosen when the SAE is built (`make_activation`), so the SAE's forward has no branches.
Each maps pre-activations `[*batch d_sae]` to feature activations of the same shape.
"""

import torch
from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.sae.config import SAEConfig

Pre = Float[Tensor, "*batch d_sae"]


class ReLU(nn.Module):
    """`max(pre, 0)`: the standard SAE, made sparse by an L1 penalty in training."""

    def forward(self, pre: Pre) -> Pre:
        """ReLU of the pre-activations."""
        return torch.relu(pre)


class TopK(nn.Module):
    """The `k` largest pre-activations of each row, through a ReLU; the rest are zero
    (Gao et al. 2024: sparsity set directly, no L1 penalty)."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k

    def forward(self, pre: Pre) -> Pre:
        """Keep the top `k` of each row."""
        values, index = pre.topk(self.k, dim=-1)
        return torch.zeros_like(pre).scatter(-1, index, torch.relu(values))

    def extra_repr(self) -> str:
        return f"k={self.k}"


class JumpReLU(nn.Module):
    """`pre` where it exceeds the feature's `threshold`, else zero (Rajamanoharan et al.
    2024), as SAELens computes it: `relu(pre) * (pre > threshold)`."""

    def __init__(self, d_sae: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.threshold = nn.Parameter(torch.zeros(d_sae, dtype=dtype))

    def forward(self, pre: Pre) -> Pre:
        """The pre-activations above their thresholds."""
        return torch.relu(pre) * (pre > self.threshold)


def make_activation(cfg: SAEConfig) -> nn.Module:
    """The activation module `cfg.activation` names."""
    if cfg.activation == "topk":
        return TopK(cfg.k)
    if cfg.activation == "jumprelu":
        return JumpReLU(cfg.d_sae, cfg.torch_dtype)
    return ReLU()


class TiedPreBias(nn.Module):
    """Subtracts the decoder bias from the input: the encoder sees `x - b_dec`."""

    def forward(self, x: Float[Tensor, "*batch d_in"], b_dec: Float[Tensor, " d_in"]):
        """`x - b_dec`."""
        return x - b_dec


class UntiedPreBias(nn.Module):
    """Subtracts a bias of its own, `b_pre`, from the input."""

    def __init__(self, d_in: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.b_pre = nn.Parameter(torch.zeros(d_in, dtype=dtype))

    def forward(self, x: Float[Tensor, "*batch d_in"], b_dec: Float[Tensor, " d_in"]):
        """`x - b_pre`."""
        return x - self.b_pre


class NoPreBias(nn.Module):
    """The input as it is (the encoder bias absorbs any offset)."""

    def forward(self, x: Float[Tensor, "*batch d_in"], b_dec: Float[Tensor, " d_in"]):
        """`x`."""
        return x


def make_pre_bias(cfg: SAEConfig) -> nn.Module:
    """The pre-bias module `cfg.pre_bias` names."""
    if cfg.pre_bias == "untied":
        return UntiedPreBias(cfg.d_in, cfg.torch_dtype)
    if cfg.pre_bias == "none":
        return NoPreBias()
    return TiedPreBias()
