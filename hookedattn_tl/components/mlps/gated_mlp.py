"""TransformerLens's `GatedMLP` component, with our equation.

`(act(x @ W_gate) * (x @ W_in + b_in)) @ W_out + b_out`: `b_in` belongs to the linear read,
as in our models (`hookedattn.core.components.mlp.GatedMLP`) and as `hook_pre_linear` says.
TL 3.5 adds `b_in` after the product instead; the two agree wherever `b_in` is zero (every
gated family: Llama, Mistral, Gemma have no MLP biases). See docs/guide/porting.md.
"""

from typing import Any

from jaxtyping import Float
from torch import Tensor

from hookedattn.core.components.embed import affine
from hookedattn_tl.components.mlps.mlp import MLP, _weight
from hookedattn_tl.hook_points import HookPoint


class GatedMLP(MLP):
    """TL's `GatedMLP(cfg)`: `MLP`'s weights plus `W_gate [d_model d_mlp]`; `hook_pre` is the
    gate's input, `hook_pre_linear` the linear read, `hook_post` their product."""

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.W_gate = _weight(self.cfg.d_model, self.d_mlp, cfg=self.cfg, std=self.cfg.init_range)
        self.hook_pre_linear = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        gate = self.hook_pre(x @ self.W_gate)
        linear = self.hook_pre_linear(affine(x, self.W_in, self.b_in))
        post = self.hook_post(self.activate(gate) * linear)
        return affine(post, self.W_out, self.b_out)


__all__ = ["GatedMLP"]
