"""TransformerLens's `GatedMLP` component, with our equation.

`(act(x @ W_gate) * (x @ W_in + b_in)) @ W_out + b_out`: `b_in` belongs to the linear read,
as in our models (`hookedattn.core.components.mlp.GatedMLP`) and as `hook_pre_linear` says.
TL 3.5 adds `b_in` after the product instead; the two agree wherever `b_in` is zero (every
gated family: Llama, Mistral, Gemma have no MLP biases). See docs/guide/porting.md.
"""

from typing import Any

from hookedattn.core.components import mlp as core
from hookedattn_tl.components.mlps.mlp import MLP, _weight
from hookedattn_tl.hook_points import HookPoint


class GatedMLP(MLP):
    """TL's `GatedMLP(cfg)`: `MLP`'s weights plus `W_gate [d_model d_mlp]`; `hook_pre` is the
    gate's input, `hook_pre_linear` the linear read, `hook_post` their product."""

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.W_gate = _weight(self.cfg.d_model, self.d_mlp, cfg=self.cfg, std=self.cfg.init_range)
        self.hook_pre_linear = HookPoint()

    # The core gated MLP's equation, written once there.
    forward = core.GatedMLP.forward


__all__ = ["GatedMLP"]
