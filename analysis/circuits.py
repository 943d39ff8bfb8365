"""QK and OV circuits of attention heads, alone and through the embedding and unembedding.

Row-vector convention (see `hookedattn.core.require_bilinear_scores`): a head's OV circuit is
`W_V @ W_O` and its QK circuit `W_Q @ W_K.T`, both `[d_model d_model]`, rank <= d_head.
The full circuits (Elhage et al. 2021, "Zero/One-Layer Attention-only Transformers") read
them in token space:

    full_qk_circuit = W_E @ QK @ W_E.T   [d_vocab d_vocab]      query token x key token
    full_ov_circuit = W_E @ OV @ W_U     [d_vocab d_vocab_out]  source token x output logit

Entry `[q, k]` of the full QK circuit is the attention score (times `attn_scale`, before
the softmax) of a query whose residual stream is `W_E[q]` for a key whose stream is
`W_E[k]`; entry `[s, t]` of the full OV circuit is the logit of `t` that the head adds for
each unit of attention it pays to a source token `s`. Both are the direct paths: for a
head past layer 0, as if the embedding reached it unchanged. Biases (and the rotation of
rotary models) are not part of any circuit. Every result is a `FactoredMatrix` through
`d_head`: a 50,257-token full circuit costs two `[50257 d_head]` factors.

Every function takes `layer` and `head`: both ints for one head (`[... ]` of the matrix
alone), `layer` only for every head of a layer (`[head ...]`), neither for every head
(`[layer head ...]`). In a hybrid model the layers with heads have circuits: every head of
every layer is refused there, naming the layers that hold a mixer.

Norms. Without `fold_ln_scale`, the full circuits are the bare weight products above, as in
the paper and in TransformerLens; they describe the model only when its norms are
weightless and their scale is ignored. With `fold_ln_scale=cache`, each norm on the path is
replaced by the linear map it applies when its divisor is frozen at the cache's mean:

    norm(x) ~ centre(x) * w / s_mean      (LayerNorm; RMSNorm has no `centre`;
                                           the `Pre` forms have no gain `w`)

where `s_mean` is the mean of that norm's `hook_scale` over every batch element and
position of the cache (per head, for models with per-head inputs). The norms on the path
are `ln1` of `layer` (for the query and key inputs of the QK circuit, for the value input
of the OV circuit) and `ln_final` (between the OV circuit and `W_U`). The norm's bias is
dropped: it adds a constant, not a term linear in the token. On a model processed with
`process_weights` (gains folded, stream centred) this is exactly the bare product divided
by the two mean scales.

Block shapes. With grouped-query attention every circuit is per query head (`W_K`, `W_V`
repeat each key/value head for the query heads that read it). A model with no `ln1` (norms
after the sublayers only, OLMo 2) has no norm on the input side; a norm after the
attention (`ln1_post`) sits between the OV circuit and the stream, and `fold_ln_scale`
linearises it too (at the mean of its `hook_scale`). A soft cap on the scores is not part
of the QK circuit (it squashes the score the circuit gives). Q/k norms make the scores
non-bilinear: every QK function refuses such a model by name
(`hookedattn.core.require_bilinear_scores`); the OV circuits are unaffected.
"""

from typing import TYPE_CHECKING

import torch
from einops import einsum
from jaxtyping import Float
from torch import Tensor, nn

from analysis._widths import require_stream_embeddings
from hookedattn.core import require_bilinear_scores
from hookedattn.core.cache import ActivationCache
from hookedattn.core.components.norm import LayerNormPre, NoNorm
from hookedattn.core.factored_matrix import FactoredMatrix
from hookedattn.core.names import expand_key

if TYPE_CHECKING:
    from hookedattn.core.model import HookedTransformer


def qk_circuit(
    model: "HookedTransformer", layer: int | None = None, head: int | None = None
) -> FactoredMatrix:
    """The QK circuit `W_Q @ W_K.T` `[d_model d_model]` (scores are `x_q QK x_k^T / attn_scale`)."""
    return _select("QK", model, layer, head)


def ov_circuit(
    model: "HookedTransformer", layer: int | None = None, head: int | None = None
) -> FactoredMatrix:
    """The OV circuit `W_V @ W_O` `[d_model d_model]`: a head writes `x @ OV` per unit attention."""
    return _select("OV", model, layer, head)


def full_qk_circuit(
    model: "HookedTransformer",
    layer: int | None = None,
    head: int | None = None,
    *,
    include_positional: bool = False,
    fold_ln_scale: ActivationCache | None = None,
) -> FactoredMatrix:
    """`W_E @ QK @ W_E.T`: query token x key token, `[... d_vocab d_vocab]`, factored.

    `include_positional=True` uses `W_E_pos` (rows `d_vocab + p` are position `p`) on both
    sides, `[... d_vocab+n_ctx d_vocab+n_ctx]`; the score of token `q` at position `i` for
    token `k` at `j` is then the sum of the four entries `[q, k]`, `[q, V+j]`, `[V+i, k]`,
    `[V+i, V+j]` (`V = d_vocab`), exactly when the norm is folded or linearised (module doc).
    `fold_ln_scale`: see the module docstring. Divide by `cfg.attn_scale` for scores.
    """
    require_bilinear_scores(model, "full_qk_circuit")
    require_stream_embeddings(model, "full_qk_circuit")
    layers, heads = _indices(model, layer, head)
    embed = _embedding(model, include_positional, fold_ln_scale)
    queries = _read(model, embed, "W_Q", layers, heads, fold_ln_scale)
    keys = _read(model, embed, "W_K", layers, heads, fold_ln_scale)
    return _squeeze(FactoredMatrix(queries, keys.mT), layer, head)


def full_ov_circuit(
    model: "HookedTransformer",
    layer: int | None = None,
    head: int | None = None,
    *,
    include_positional: bool = False,
    fold_ln_scale: ActivationCache | None = None,
) -> FactoredMatrix:
    """`W_E @ OV @ W_U`: source token x output logit, `[... d_vocab d_vocab_out]`, factored.

    `include_positional=True` uses `W_E_pos` as the source side (`[... d_vocab+n_ctx
    d_vocab_out]`; row `d_vocab + p` is what position `p` of the source contributes).
    `fold_ln_scale`: see the module docstring.
    """
    require_stream_embeddings(model, "full_ov_circuit", unembedding=True)
    layers, heads = _indices(model, layer, head)
    embed = _embedding(model, include_positional, fold_ln_scale)
    values = _read(model, embed, "W_V", layers, heads, fold_ln_scale)
    W_O = model.stacked("W_O", layers)[:, heads]
    if fold_ln_scale is not None:
        W_O = _through_post_norms(model, W_O, layers, fold_ln_scale)
        W_O = _linearised(model, W_O, model.ln_final, _mean_scale(fold_ln_scale, "scale"))
    logits = einsum(
        W_O,
        model.W_U,
        "layer head d_head d_model, d_model d_vocab_out -> layer head d_head d_vocab_out",
    )
    return _squeeze(FactoredMatrix(values, logits), layer, head)


# ---------------------------------------------------------------------- helpers
def _indices(
    model: "HookedTransformer", layer: int | None, head: int | None
) -> tuple[list[int], list[int]]:
    model.cfg.require_one_attention_shape("the full circuits")
    n_layers, n_heads = model.cfg.n_layers, model.cfg.n_heads
    if layer is None and head is not None:
        raise ValueError(f"head={head} was given without a layer: give layer= too")
    for name, value, size in (("layer", layer, n_layers), ("head", head, n_heads)):
        if value is not None and (not isinstance(value, int) or not -size <= value < size):
            raise ValueError(
                f"{name} must be an int in 0..{size - 1} (or None for all), got {value!r}"
            )
    layers = list(range(n_layers)) if layer is None else [layer % n_layers]
    heads = list(range(n_heads)) if head is None else [head % n_heads]
    return layers, heads


def _select(
    kind: str, model: "HookedTransformer", layer: int | None, head: int | None
) -> FactoredMatrix:
    """The `kind` circuits ("QK", "OV") of the chosen heads (of the chosen blocks only: in a
    hybrid model, the blocks with heads)."""
    layers, heads = _indices(model, layer, head)
    return _squeeze(model.head_circuits(kind, layers)[:, heads], layer, head)


def _squeeze(fm: FactoredMatrix, layer: int | None, head: int | None) -> FactoredMatrix:
    """Drop the `[layer head]` axes that were chosen by an int."""
    if head is not None:
        return fm[0, 0]
    if layer is not None:
        return fm[0]
    return fm


def _embedding(
    model: "HookedTransformer", include_positional: bool, fold_ln_scale: ActivationCache | None
) -> Float[Tensor, "src d_model"]:
    if fold_ln_scale is not None and model.cfg.normalization_type is None:
        raise ValueError("fold_ln_scale was given, but this model has no normalisation layers")
    return model.W_E_pos if include_positional else model.W_E


def _read(
    model: "HookedTransformer",
    embed: Float[Tensor, "src d_model"],
    weight: str,
    layers: list[int],
    heads: list[int],
    cache: ActivationCache | None,
) -> Float[Tensor, "layer head src d_head"]:
    """`embed @ weight` for the chosen heads, through `ln1` linearised at the cache's scale.

    One matmul per layer, never an `[layer head src d_model]` copy of the embedding.
    """
    W = model.stacked(weight, layers)[:, heads]  # [layer head d_model d_head]
    pattern = "src d_model, head d_model d_head -> head src d_head"
    if cache is None:
        return einsum(embed, W, "src d_model, layer head d_model d_head -> layer head src d_head")
    out = []
    for i, layer in enumerate(layers):
        norm = model.blocks[layer].ln1
        if isinstance(norm, NoNorm):  # norms after the sublayers only: none reads the stream
            out.append(einsum(embed, W[i], pattern))
            continue
        scale = _mean_scale(cache, "scale", layer, "ln1")
        # One scale per head when each head has its own copy of the input (use_attn_in...).
        scale = scale[heads][:, None, None] if scale.ndim else scale
        rows = _linearised(model, embed, norm)
        out.append(einsum(rows, W[i], pattern) / scale)
    return torch.stack(out)


def _through_post_norms(
    model: "HookedTransformer",
    W_O: Float[Tensor, "layer head d_head d_model"],
    layers: list[int],
    cache: ActivationCache,
) -> Float[Tensor, "layer head d_head d_model"]:
    """Each layer's `W_O` through the norm after its attention (`ln1_post`), if any,
    linearised at the mean of that norm's cached scale."""
    out = []
    for i, layer in enumerate(layers):
        norm = model.blocks[layer].ln1_post
        if isinstance(norm, NoNorm):
            out.append(W_O[i])
        else:
            scale = _mean_scale(cache, "scale", layer, "ln1_post")
            out.append(_linearised(model, W_O[i], norm, scale))
    return torch.stack(out)


def _linearised(
    model: "HookedTransformer",
    rows: Float[Tensor, "... d_model"],
    norm: nn.Module,
    scale: Tensor | float = 1.0,
) -> Float[Tensor, "... d_model"]:
    """`rows` through `norm` with its divisor frozen at `scale`, and its bias dropped."""
    if isinstance(norm, NoNorm):
        return rows
    if isinstance(norm, LayerNormPre):
        rows = rows - rows.mean(dim=-1, keepdim=True)
    gain = getattr(norm, "w", None)
    return (rows if gain is None else rows * gain) / scale


def _mean_scale(cache: ActivationCache, *key: object) -> Tensor:
    """The mean of a norm's `hook_scale`: one number, or one per head for per-head inputs."""
    key = key if len(key) > 1 else key[0]
    if key not in cache:
        raise KeyError(
            f"fold_ln_scale needs {expand_key(key, cache.n_layers)!r}, which this cache does "
            f"not hold: run_with_cache with a names_filter that keeps the 'hook_scale' "
            f"activations"
        )
    scale = cache[key]
    has_head_axis = scale.ndim == (4 if cache.has_batch_dim else 3)
    if has_head_axis:
        return scale.flatten(0, -3).mean(dim=0)[..., 0]
    return scale.mean()
