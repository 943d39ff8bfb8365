"""BERT's head transform: a dense map, an activation and a norm between the last residual
stream and the unembedding.

    x = ln_unembed(act(x @ W_dense + b_dense))        (hook_pre before act, hook_post after)

`W_dense: [d_model d_unembed]`: square, or to the narrower (or wider) width `d_unembed` the
unembedding reads (ELECTRA's and RemBERT's heads), the norm over that width. Built when
`cfg.unembed_transform` names the activation; otherwise the model composes `NoTransform`,
the identity, so the forward is the same line either way. The logits are then no linear
function of the final stream: direct logit attribution refuses such a model.
"""

from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.core.components.embed import _param, affine
from hookedattn.core.components.mlp import ACTIVATIONS
from hookedattn.core.components.norm import make_norm
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hook_points import HookPoint


class NoTransform(nn.Module):
    """The identity, where the unembedding reads the final stream itself (no hooks)."""

    def __call__(self, x: Tensor) -> Tensor:
        return x

    forward = __call__


class UnembedTransform(nn.Module):
    """`ln_unembed(act(x @ W_dense + b_dense))`, before the unembedding (BERT's LM head)."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        self.W_dense = _param(cfg.d_model, cfg.unembed_width, cfg=cfg)
        self.b_dense = _param(cfg.unembed_width, cfg=cfg)
        self.act_fn = ACTIVATIONS[cfg.unembed_transform]
        self.hook_pre = HookPoint()  # [batch pos d_unembed]
        self.hook_post = HookPoint()
        self.ln_unembed = make_norm(cfg, (cfg.unembed_width,))

    def forward(
        self, x: Float[Tensor, "batch pos d_model"]
    ) -> Float[Tensor, "batch pos d_unembed"]:
        pre = self.hook_pre(affine(x, self.W_dense, self.b_dense))
        return self.ln_unembed(self.hook_post(self.act_fn(pre)))


def make_unembed_transform(cfg: HookedTransformerConfig) -> nn.Module:
    """The head transform the config asks for, or the identity."""
    return NoTransform() if cfg.unembed_transform is None else UnembedTransform(cfg)
