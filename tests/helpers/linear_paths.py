"""A hand-built linear model whose every path is known, and its two prompts: shared by the
tests of path patching and of circuit discovery."""

import torch

from hookedattn import HookedTransformer, HookedTransformerConfig

WEIGHTS = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float64)  # what S reads per token
CLEAN = torch.tensor([[0, 2, 1, 3, 2], [1, 1, 0, 2, 3]])
CORRUPTED = torch.tensor([[3, 1, 2, 0, 0], [2, 0, 3, 1, 1]])
A, B, C, D, E = slice(0, 4), 4, 5, 6, 7  # residual subspaces: token, S, M, R, R2


def hand_built() -> HookedTransformer:
    """Three attention-only layers, no norms, uniform causal attention (W_Q = W_K = 0):

    S  = head 0.0 reads the token (weighted by WEIGHTS) and writes B;
    M  = head 1.0 reads B and writes 2x into C;
    R  = head 2.0 reads B and writes D;      R2 = head 2.1 reads C and writes E;
    the logit of token 0 reads D + 3 E. Every other weight is zero.
    """
    cfg = HookedTransformerConfig(
        n_layers=3, d_model=10, n_heads=2, d_head=2, n_ctx=8, d_vocab=4, attn_only=True,
        normalization_type=None, positional_embedding_type="none", dtype=torch.float64,
    )  # fmt: skip
    model = HookedTransformer(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.embed.W_E[:, A] = torch.eye(4, dtype=torch.float64)
        wire = [(0, 0, A, B, WEIGHTS, 1.0), (1, 0, B, C, 1.0, 2.0), (2, 0, B, D, 1.0, 1.0)]
        wire += [(2, 1, C, E, 1.0, 1.0)]
        for layer, head, reads, writes, w_v, w_o in wire:
            attn = model.blocks[layer].attn
            attn.W_V[head, reads, 0] = w_v
            attn.W_O[head, 0, writes] = w_o
        model.unembed.W_U[D, 0] = 1.0
        model.unembed.W_U[E, 0] = 3.0
    return model


def metric(logits: torch.Tensor) -> torch.Tensor:
    return logits[:, -1, 0]


def prefix_mean(x: torch.Tensor) -> torch.Tensor:
    """Uniform causal attention: position i averages positions 0..i."""
    return x.cumsum(-1) / torch.arange(1, x.shape[-1] + 1)


def paths(tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The last position's D and 3 E, by hand."""
    b = prefix_mean(WEIGHTS[tokens])
    d = prefix_mean(b)[:, -1]
    e = 3 * prefix_mean(prefix_mean(2 * b))[:, -1]
    return d, e
