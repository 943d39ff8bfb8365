"""Token embedding, learned positional embedding and unembedding."""

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from hookedattn.core.components.soft_cap import make_soft_cap
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.kernels._views import transposed


def _param(*shape: int, cfg: HookedTransformerConfig) -> nn.Parameter:
    """An uninitialised parameter; `HookedTransformer.init_weights` fills it."""
    return nn.Parameter(torch.empty(*shape, dtype=cfg.dtype, device=cfg.device))


def affine_params(
    d_in: int, d_out: int, cfg: HookedTransformerConfig
) -> tuple[nn.Parameter, nn.Parameter]:
    """The weight `[d_in d_out]` and bias `[d_out]` of one map `affine` applies."""
    return _param(d_in, d_out, cfg=cfg), _param(d_out, cfg=cfg)


def affine(
    x: Float[Tensor, "... d_in"],
    W: Float[Tensor, "d_in d_out"],
    b: Float[Tensor, " d_out"] | None,
) -> Float[Tensor, "... d_out"]:
    """`x @ W + b` in one call (`b` None: no bias): the bias is added inside the matmul, not
    in a second pass (`W.T`, the layout `F.linear` takes, kept between calls:
    `kernels.transposed`)."""
    return nn.functional.linear(x, transposed(W), b)


class Embed(nn.Module):
    """Token ids to vectors: row `t` of `W_E: [d_vocab d_model]` for token `t` (`d_embed`
    wide where a projection follows: `components.embed_projection`)."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        self.W_E = _param(cfg.d_vocab, cfg.embed_width, cfg=cfg)

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.lookup(tokens)  # `W_E[tokens]`

    def lookup(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        """Row `t` of `W_E` for each token `t`, by the lookup kernel (a third of the time of
        advanced indexing); the step a split of the vocabulary over processes replaces."""
        return nn.functional.embedding(tokens, self.W_E)


class PosEmbed(nn.Module):
    """Positions to vectors: row `p` of `W_pos: [n_ctx d_model]` for position `p`."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        self.W_pos = _param(cfg.n_ctx, cfg.embed_width, cfg=cfg)

    def forward(self, positions: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return nn.functional.embedding(positions, self.W_pos)  # `W_pos[positions]`


class Unembed(nn.Module):
    """The residual stream to logits: `x @ W_U + b_U`, `W_U: [d_model d_vocab_out]` (rows
    `d_unembed` where a head transform maps the stream to that width).

    With `output_logits_soft_cap` (Gemma 2) the logits are then squashed, `c * tanh(l /
    c)`; direct logit attributions are exact for the logits before the cap. `hook_in` is
    the normed stream the unembedding reads, `hook_out` the logits returned.
    """

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        self.hook_in = HookPoint()  # [batch pos d_model]
        self.W_U = _param(cfg.unembed_width, cfg.d_vocab_out, cfg=cfg)
        self.b_U = _param(cfg.d_vocab_out, cfg=cfg)
        self.soft_cap = make_soft_cap(cfg.output_logits_soft_cap)
        self.hook_out = HookPoint()  # [batch pos d_vocab_out]

    def forward(
        self, x: Float[Tensor, "batch pos d_model"]
    ) -> Float[Tensor, "batch pos d_vocab_out"]:
        logits = self.joined(affine(self.enter(self.hook_in(x)), self.W_U, self.b_U))
        return self.hook_out(self.soft_cap(logits))

    # The steps a split of the vocabulary over processes replaces (`hookedattn.core.parallel`).
    def enter(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        """The stream the unembedding reads: itself."""
        return x

    def joined(
        self, logits: Float[Tensor, "batch pos d_vocab_out"]
    ) -> Float[Tensor, "batch pos d_vocab_out"]:
        """Every token's logit: the logits as computed."""
        return logits
