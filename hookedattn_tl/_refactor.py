"""TransformerLens's `refactor_factored_attn_matrices`, over a facade model's parameters."""

from typing import Any

import torch
from einops import einsum

from hookedattn.core.factored_matrix import FactoredMatrix


def refactor_factored_attn_matrices(model: Any) -> None:
    """Re-split, in place, each head's QK and OV circuits into balanced factors, as TL's
    `refactor_factored_attn_matrices` does (its `process_weights_` flag).

    QK: the bilinear form of `(x W_Q + b_Q)` and `(y W_K + b_K)` is that of `[x 1]` and
    `[y 1]` through `W_Q_eff = [W_Q; b_Q]` and `W_K_eff = [W_K; b_K]` (a `d_model + 1`
    input whose last coordinate is 1); with the SVD `W_Q_eff W_K_eff^T = U S V^T`,
    `W_Q_eff = U sqrt(S)` and `W_K_eff = V sqrt(S)`, split back into weights and biases.
    OV: `b_V` goes into `b_O` (the pattern's rows sum to 1), then `W_V W_O = U S V^T`
    gives `W_V = U S`, `W_O = V^T` (a head's `z` has the norm of its output).
    Scores, patterns and outputs are unchanged; `q`, `k`, `v`, `z` are not. Rotary models
    (their QK depends on the positions) and grouped-query ones are refused, by name.
    """
    if model.cfg.positional_embedding_type == "rotary":
        raise ValueError(
            "refactor_factored_attn_matrices=True cannot refactor a rotary model's QK "
            "circuit: it depends on the query's and the key's positions"
        )
    if model.cfg.n_key_value_heads is not None:
        raise ValueError(
            f"refactor_factored_attn_matrices=True needs one key/value head per query head; "
            f"this model has n_key_value_heads={model.cfg.n_key_value_heads}"
        )
    with torch.no_grad():
        for block in model.blocks:
            _refactor_attention(block.attn)


def _refactor_attention(attn: Any) -> None:
    W_Q_eff = torch.cat([attn.W_Q, attn.b_Q[:, None, :]], dim=1)
    W_K_eff = torch.cat([attn.W_K, attn.b_K[:, None, :]], dim=1)
    W_Q_even, W_K_even_T = FactoredMatrix(W_Q_eff, W_K_eff.mT).make_even().pair
    W_K_even = W_K_even_T.mT
    attn.W_Q.copy_(W_Q_even[:, :-1]), attn.b_Q.copy_(W_Q_even[:, -1])
    attn.W_K.copy_(W_K_even[:, :-1]), attn.b_K.copy_(W_K_even[:, -1])
    attn.b_O.add_(einsum(attn.b_V, attn.W_O, "head d_head, head d_head d_model -> d_model"))
    attn.b_V.zero_()
    svd = FactoredMatrix(attn.W_V, attn.W_O).svd()
    attn.W_V.copy_(svd.U * svd.S[..., None, :])
    attn.W_O.copy_(svd.V.mT)
