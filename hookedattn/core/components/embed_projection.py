"""A learned projection from embeddings narrower (or wider) than the stream into it.

    resid = ln_embed(W_E[tokens] + W_pos[positions]) @ W_proj + b_proj

`W_proj: [d_embed d_model]`, `b_proj: [d_model]` (ELECTRA's `embeddings_project`, RemBERT's
`embedding_hidden_mapping_in`). Built when `cfg.d_embed` is set; otherwise the model composes
`NoProjection`, the identity, so its input stage reads the same either way. `hook_embed` and
`hook_pos_embed` keep the `d_embed`-wide vectors; what the projection writes is the stream
entering block 0 (`blocks.0.hook_resid_pre`), so it needs no hook point of its own. A
residual decomposition passes each embedding term through `W_proj` and keeps `b_proj` as a
term of its own (`analysis.decomposition`).
"""

from jaxtyping import Float
from torch import Tensor, nn

from hookedattn.core.components.embed import _param, affine
from hookedattn.core.config import HookedTransformerConfig


class NoProjection(nn.Module):
    """The identity, where the embeddings are as wide as the stream (no hooks)."""

    def __call__(self, x: Tensor) -> Tensor:
        return x

    forward = __call__


class EmbedProjection(nn.Module):
    """`x @ W_proj + b_proj`: the embeddings, `d_embed` wide, into the `d_model` stream."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        self.W_proj = _param(cfg.embed_width, cfg.d_model, cfg=cfg)
        self.b_proj = _param(cfg.d_model, cfg=cfg)

    def forward(self, x: Float[Tensor, "batch pos d_embed"]) -> Float[Tensor, "batch pos d_model"]:
        return affine(x, self.W_proj, self.b_proj)


def make_embed_projection(cfg: HookedTransformerConfig) -> nn.Module:
    """The projection the config asks for (`d_embed`), or the identity."""
    return NoProjection() if cfg.d_embed is None else EmbedProjection(cfg)
