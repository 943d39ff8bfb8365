"""TransformerLens's activation functions, by TL's names (`SUPPORTED_ACTIVATIONS`).

Our models' MLPs use `hookedattn.core.components.mlp.ACTIVATIONS` (relu, gelu, gelu_new,
silu, solu_ln); the TL ones beyond those (plain SoLU, `gelu_fast`, `gelu_pytorch_tanh`) serve
the facade's standalone components (`hookedattn_tl.components.MLP`).
"""

from collections.abc import Callable

import torch
from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.core.components.mlp import gelu_new, solu


def gelu_fast(input: Float[Tensor, "... d_mlp"]) -> Float[Tensor, "... d_mlp"]:
    """GELU's tanh approximation written with `0.7978845608 = sqrt(2 / pi)` (TL's gelu_fast)."""
    return 0.5 * input * (1.0 + torch.tanh(input * 0.7978845608 * (1.0 + 0.044715 * input**2)))


def gelu_pytorch_tanh(input: Float[Tensor, "... d_mlp"]) -> Float[Tensor, "... d_mlp"]:
    """torch's GELU with `approximate="tanh"`."""
    return nn.functional.gelu(input, approximate="tanh")


SUPPORTED_ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "solu": solu,
    "solu_ln": solu,
    "gelu_new": gelu_new,
    "gelu_fast": gelu_fast,
    "silu": nn.functional.silu,
    "relu": nn.functional.relu,
    "gelu": nn.functional.gelu,
    "gelu_pytorch_tanh": gelu_pytorch_tanh,
}
