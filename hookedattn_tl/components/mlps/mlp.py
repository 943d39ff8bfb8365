"""TransformerLens's `MLP` component: `act(x @ W_in + b_in) @ W_out + b_out`, TL's activations.

A standalone component with TL's constructor, for code that builds one, running the core's
own equation (`hookedattn.core.components.mlp.MLP.forward`). With a `*_ln` activation
(SoLU-LN), the norm runs between `hook_mid` and `hook_post` (`activate`).
"""

from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.core.components import mlp as core
from hookedattn_tl.components.mlps.can_be_used_as_mlp import CanBeUsedAsMLP
from hookedattn_tl.hook_points import HookPoint


def _weight(*shape: int, cfg: Any, std: float | None) -> nn.Parameter:
    """A parameter drawn from `N(0, std)`, or zeros for `std=None` (a bias)."""
    tensor = torch.zeros(*shape, dtype=cfg.dtype, device=cfg.device)
    return nn.Parameter(tensor if std is None else tensor.normal_(0.0, std))


class MLP(CanBeUsedAsMLP):
    """TL's `MLP(cfg)`: `W_in [d_model d_mlp]`, `b_in`, `W_out [d_mlp d_model]`, `b_out`;
    `hook_pre` and `hook_post` `[batch pos d_mlp]` (and `hook_mid` for `*_ln`)."""

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.select_activation_function()
        std = self.cfg.init_range
        self.W_in = _weight(self.cfg.d_model, self.d_mlp, cfg=self.cfg, std=std)
        self.b_in = _weight(self.d_mlp, cfg=self.cfg, std=None)
        self.W_out = _weight(self.d_mlp, self.cfg.d_model, cfg=self.cfg, std=std)
        self.b_out = _weight(self.cfg.d_model, cfg=self.cfg, std=None)
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    def activate(self, pre: Float[Tensor, "batch pos d_mlp"]) -> Float[Tensor, "batch pos d_mlp"]:
        """The activation, and for a `*_ln` one the norm after it (the core's step,
        `NeuronNormMLP.activate`)."""
        if self.ln is None:
            return core.MLP.activate(self, pre)
        return core.NeuronNormMLP.activate(self, pre)

    # The core MLP's equation, written once there: `act(x @ W_in + b_in) @ W_out + b_out`,
    # the activation through `activate` (above).
    forward = core.MLP.forward
    enter = core.MLP.enter
    write = core.MLP.write


__all__ = ["MLP"]
