"""Per-layer inputs (Gemma 4's small sizes' "per-layer embeddings"): each block reads an
input of its own, `d_per_layer_input` wide, made once per forward from the tokens and
their embedding, through a third sublayer after its MLP.

    p        = ln(x_embed @ W_proj) + W_E[tokens]      [batch pos layer d_ple]
                                                        (PerLayerInputs: model.per_layer_inputs,
                                                         hook_per_layer_inputs)
    out_L    = ln_post((act(resid @ W_gate) * p[L]) @ W_out)      (PerLayerInput, in block L:
                                                                 hook_gate, hook_input)

`x_embed` is the embedding entering block 0 (`hook_embed`'s). `transformers` scales the
projection by `d_model ** -0.5` before its norm, the table by `sqrt(d_ple)`, and their sum
by `2 ** -0.5`: the importer folds the first into `W_proj`, the others into `W_E` and
`ln.w` (linear maps and a gain), so these equations hold as written. The block adds
`out_L` to the stream it leaves, behind `hook_per_layer_out`, so the writes still sum.
"""

from einops import einsum
from jaxtyping import Float, Int
from torch import Tensor, nn

from hookedattn.core.components.embed import _param
from hookedattn.core.components.mlp import ACTIVATIONS
from hookedattn.core.components.norm import make_norm
from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hook_points import HookPoint
from hookedattn.core.shapes import Resid

PerLayer = Float[Tensor, "batch pos layer d_ple"]


class PerLayerInputs(nn.Module):
    """Every block's per-layer input, `ln(x_embed @ W_proj) + W_E[tokens]`."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        d_ple, vocab = cfg.d_per_layer_input, cfg.d_vocab_per_layer_input or cfg.d_vocab
        self.W_E = _param(vocab, cfg.n_layers, d_ple, cfg=cfg)
        self.W_proj = _param(cfg.d_model, cfg.n_layers, d_ple, cfg=cfg)
        self.ln = make_norm(cfg, (d_ple,))
        self.hook_per_layer_inputs = HookPoint()  # [batch pos layer d_ple]

    def forward(
        self, tokens: Int[Tensor, "batch pos"], embedding: Float[Tensor, "batch pos d_model"]
    ) -> PerLayer:
        projected = einsum(
            embedding,
            self.W_proj,
            "batch pos d_model, d_model layer d_ple -> batch pos layer d_ple",
        )
        return self.hook_per_layer_inputs(self.ln(projected) + self.W_E[tokens])


class PerLayerInput(nn.Module):
    """A block's sublayer reading its per-layer input: `ln_post((act(x @ W_gate) * p) @ W_out)`."""

    def __init__(self, cfg: HookedTransformerConfig) -> None:
        super().__init__()
        d_ple = cfg.d_per_layer_input
        self.W_gate = _param(cfg.d_model, d_ple, cfg=cfg)
        self.W_out = _param(d_ple, cfg.d_model, cfg=cfg)
        self.act_fn = ACTIVATIONS[cfg.act_fn]
        self.hook_gate = HookPoint()  # [batch pos d_ple], act(x @ W_gate)
        self.hook_input = HookPoint()  # [batch pos d_ple], this block's per-layer input
        self.ln_post = make_norm(cfg)

    def forward(self, resid: Resid, per_layer: Float[Tensor, "batch pos d_ple"]) -> Resid:
        pre = einsum(resid, self.W_gate, "batch pos d_model, d_model d_ple -> batch pos d_ple")
        mixed = self.hook_gate(self.act_fn(pre)) * self.hook_input(per_layer)
        return self.ln_post(
            einsum(mixed, self.W_out, "batch pos d_ple, d_ple d_model -> batch pos d_model")
        )
