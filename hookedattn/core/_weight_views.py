"""Views of a model's weights that circuit analysis reads: QK and OV circuits, W_E_pos.

Row-vector convention, as everywhere in this package: a head reads `x @ W_V[h]` and
writes `z @ W_O[h]`, so its two circuits, as `[d_model d_model]` matrices acting on row
vectors, are

    OV = W_V @ W_O          the residual vector a head writes for each one it attends to
    QK = W_Q @ W_K.T        attention score (before the `1/attn_scale`) = x_q @ QK @ x_k.T

These are the transposes of the column-vector `W_OV = W_O W_V` of Elhage et al. (2021);
`QK` equals their `W_QK = W_Q^T W_K`. Both are kept factored (`FactoredMatrix`): rank at
most `d_head`. Biases and the positional rotation of rotary models are not part of them.

On the composed shapes: with grouped-query attention `W_K`, `W_V` show each key/value head
for every query head that reads it, so both circuits stay per query head. A soft cap on
the scores (`attn_scores_soft_cap`) acts after the QK circuit; a norm after the attention
(`ln1_post`) after the OV circuit. A model that normalises its queries and keys
(`use_qk_norm`) has no QK circuit: its score is `norm(x_q W_Q) . norm(x_k W_K)`, not
bilinear in the stream, and `QK` (with every function built on it) refuses it by name.
With attention sinks (GPT-OSS) both circuits are defined: a head's sink is one more score,
a constant per head outside the QK circuit, and its value is zero, so it adds nothing to
the OV circuit (the pattern's rows then sum to less than one). YaRN's attention factor
scales queries and keys with the rotation, and is outside the circuits as the rotation is.
A mixture of experts changes only the MLPs: these circuits are the attention's. Latent
attention (DeepSeek) reads its keys and values from an RMS-normed latent of the stream, so
it has no `d_model x d_model` circuits: `QK` and `OV` refuse it, and each layer's
`attn.QK`, `attn.QK_rope` and `attn.OV` are its circuits between the latents.

`HookedTransformer` exposes these as `model.QK`, `model.OV`, `model.W_E_pos`,
`model.all_head_labels` and `model.tokens_to_residual_directions`.
"""

from collections.abc import Sequence
from typing import Any

import torch
from jaxtyping import Float
from torch import Tensor

from hookedattn.core.factored_matrix import FactoredMatrix
from hookedattn.core.names import head_label

# A `HookedTransformer`, not imported by name: the model module imports this one.
Model = Any

Tokens = str | int | Sequence[str | int] | Tensor


def QK(model: Model, layers: Sequence[int] | None = None) -> FactoredMatrix:
    """Every head's QK circuit `W_Q @ W_K.T`, `[layer head d_model d_model]`, factored: of
    every block, or of the blocks `layers`.

    `model.QK[layer]` is one layer's heads, `model.QK[layer, head]` one head. Refused for
    a model with q/k norms (module docstring).
    """
    require_bilinear_scores(model, "model.QK")
    return FactoredMatrix(model.stacked("W_Q", layers), model.stacked("W_K", layers).mT)


def require_bilinear_scores(model: Model, what: str) -> None:
    """Raise a `ValueError` naming `what` if the model's attention scores are not bilinear.

    With `use_qk_norm` each query and key is divided by its own RMS (and multiplied by a
    gain) between the projection and the dot product, so no `d_model x d_model` matrix
    gives the scores: a QK circuit, and every score built from one, does not exist.
    """
    _refuse_latent_attention(model, what, "QK")
    if model.cfg.use_qk_norm:
        raise ValueError(
            f"{what} needs attention scores bilinear in the residual stream, x_q W_Q W_K^T "
            f"x_k^T; this model normalises queries and keys (use_qk_norm=True), so its "
            f"scores are norm(x_q W_Q) . norm(x_k W_K), which no QK matrix gives. The bare "
            f"weight product is FactoredMatrix(model.W_Q, model.W_K.mT), if that is wanted"
        )


def OV(model: Model, layers: Sequence[int] | None = None) -> FactoredMatrix:
    """Every head's OV circuit `W_V @ W_O`, `[layer head d_model d_model]`, factored: of
    every block, or of the blocks `layers`."""
    _refuse_latent_attention(model, "model.OV", "OV")
    if model.cfg.differential_attention:
        raise ValueError(
            "model.OV needs each head's value read and write to be one matrix; this model's "
            "attention is differential (differential_attention=True): W_O reads pairs of "
            "heads, their z subtracted and RMS-normed per pair, so no d_model x d_model "
            "matrix gives a head's write (components/differential_attention.py)"
        )
    return FactoredMatrix(model.stacked("W_V", layers), model.stacked("W_O", layers))


def _refuse_latent_attention(model: Model, what: str, circuit: str) -> None:
    """A `ValueError` for latent attention, whose circuits start from its normed latents."""
    if model.cfg.is_latent_attention:
        raise ValueError(
            f"{what} needs heads that read the residual stream through a matrix; this model's "
            f"attention is latent (kv_lora_rank={model.cfg.kv_lora_rank}): its keys and values "
            f"(and queries, with q_lora_rank) are read from RMS-normed latents of the stream, "
            f"so no d_model x d_model matrix gives them. Its circuits between the latents are "
            f"model.blocks[layer].attn.{circuit} (components/latent_attention.py)"
        )


def W_E_pos(model: Model) -> Float[Tensor, "d_vocab_and_n_ctx d_model"]:
    """Token and positional embeddings stacked: `[d_vocab + n_ctx, d_model]`.

    Row `t < d_vocab` embeds token `t`, row `d_vocab + p` position `p`; the input to the
    first block is the sum of one row of each kind, so a linear circuit applied to these
    rows gives the token and the positional terms of that input separately. Refused for a
    shortformer model, whose positions never enter the stream (TransformerLens stacks them
    all the same): read `model.W_E` and `model.W_pos` apart there.
    """
    if model.cfg.positional_embedding_type == "shortformer":
        raise ValueError(
            "W_E_pos stacks the rows that sum to the stream entering block 0, but this model "
            "has shortformer positional embeddings (positional_embedding_type='shortformer'): "
            "W_pos is added to each layer's query and key inputs, not to the stream. Use "
            "model.W_E (the stream) and model.W_pos (the queries' and keys' positions) apart"
        )
    return torch.cat([model.W_E, model.W_pos], dim=0)


def all_head_labels(model: Model) -> list[str]:
    """`"L{layer}H{head}"` for every head, layer-major (the order of `[layer head]` flattened;
    each block's own heads where they differ per block)."""
    heads = [model.cfg.attention_config(layer).n_heads for layer in range(model.cfg.n_layers)]
    return [head_label(layer, head) for layer, n in enumerate(heads) for head in range(n)]


def tokens_to_residual_directions(model: Model, tokens: Tokens) -> Float[Tensor, "*tokens d_model"]:
    """The unembedding direction of each token: column `W_U[:, t]`, shaped `[*tokens d_model]`.

    `tokens` is a token id, a string (exactly one token: `model.to_single_token`), a list
    of either, or an integer tensor of any shape; the result has the shape of `tokens`
    plus a `d_model` axis (`[d_model]` for a single token). The dot product of the final
    residual stream, after `ln_final`, with this direction is the token's logit minus
    `b_U[t]`. (TransformerLens squeezes a one-element tensor to `[d_model]`; here the
    shape always follows the input.)
    """
    ids = _token_ids(model, tokens)
    d_vocab_out = model.cfg.d_vocab_out
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= d_vocab_out):
        bad = int(ids.min()) if int(ids.min()) < 0 else int(ids.max())
        raise ValueError(f"token id {bad} is out of range 0..{d_vocab_out - 1} (d_vocab_out)")
    return model.W_U.mT[ids.to(model.W_U.device)]


def _token_ids(model: Model, tokens: Tokens) -> Tensor:
    if isinstance(tokens, Tensor):
        if tokens.dtype.is_floating_point or tokens.dtype.is_complex or tokens.dtype == torch.bool:
            raise TypeError(f"token ids must be an integer tensor, got {tokens.dtype}")
        return tokens.long()
    if isinstance(tokens, str | int) and not isinstance(tokens, bool):
        return torch.tensor(_one_token(model, tokens))
    if isinstance(tokens, Sequence) and not isinstance(tokens, str):
        return torch.tensor([_one_token(model, t) for t in tokens], dtype=torch.long)
    raise TypeError(
        f"tokens must be an int, a str, a list of them or an integer tensor, "
        f"got {type(tokens).__name__}"
    )


def _one_token(model: Model, token: object) -> int:
    if isinstance(token, int) and not isinstance(token, bool):
        return token
    if isinstance(token, str):
        if model.tokenizer is None:
            raise ValueError(
                f"cannot look up the string {token!r}: this model has no tokenizer; "
                "pass token ids instead"
            )
        return model.to_single_token(token)
    raise TypeError(f"a token must be an int or a str, got {type(token).__name__}")
