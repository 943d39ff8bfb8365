"""Weight processing: new models whose weights read more simply and compute the same thing.

Each function returns a NEW model (the input is never changed; hooks are not carried
over; the tokenizer and train/eval mode are) and says exactly what it preserves:

    fold_layer_norm         logits and every activation except `hook_normalized`
    center_writing_weights  logits and normalised activations; the residual stream loses
                            its mean component (LayerNorm models only)
    center_unembed          log-probabilities; logits shift by a constant per position
    fold_value_biases       logits; `hook_v`, `hook_z`, `hook_result` lose `b_V`
    process_weights         all of the above that apply, in that order (TransformerLens's
                            `process_weights_`, without mutating anything)

The arithmetic runs in float64 and is cast back once, so a float32 model changes by one
rounding, not by the rounding of each step.
"""

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from einops import einsum
from torch import Tensor

from hookedattn.config import HookedTransformerConfig
from hookedattn.weights_io import load_checked_state_dict

if TYPE_CHECKING:
    from hookedattn.model import HookedTransformer

State = dict[str, Tensor]
Transform = Callable[[State, HookedTransformerConfig], HookedTransformerConfig]

_PRE_FORM = {"LN": "LNPre", "LNPre": "LNPre", "RMS": "RMSPre", "RMSPre": "RMSPre"}
_CENTRING_NORMS = ("LN", "LNPre")


def fold_layer_norm(model: "HookedTransformer") -> "HookedTransformer":
    """Fold each norm's gain `w` and bias `b` into the weights that read its output.

    A norm followed by a linear map, `(w * x_hat + b) @ W + c`, equals
    `x_hat @ (w[:, None] * W) + (b @ W + c)`: so `W_Q, W_K, W_V` (and `b_Q, b_K, b_V`) take
    `ln1`'s gain and bias, `W_in, b_in` take `ln2`'s, `W_U, b_U` take `ln_final`'s, and the
    norms become their weightless forms (`LN` -> `LNPre`, `RMS` -> `RMSPre`). For
    LayerNorm the reading weights are also centred along `d_model` (their component along
    the all-ones direction is multiplied by the mean of `x_hat`, which is zero).

    Preserves: logits exactly, and every activation except the norms' `hook_normalized`
    (now before the gain and bias). A model already in a `Pre` form is accepted (its
    reading weights are centred, if LayerNorm). A model without norms is refused.
    """
    return _processed(model, [_fold_layer_norm])


def center_writing_weights(model: "HookedTransformer") -> "HookedTransformer":
    """Remove the mean over `d_model` from every weight and bias that writes to the stream.

    `W_E`, `W_pos`, `W_O`, `b_O`, `W_out`, `b_out` are centred, so the residual stream has
    zero mean. Preserves the logits and every norm's output exactly, because every reader
    of the stream is a LayerNorm, which subtracts the mean first: `LN(x + c) = LN(x)` for a
    constant vector `c`. Changes: `hook_embed`, `hook_pos_embed`, `hook_resid_*`,
    `hook_attn_out`, `hook_mlp_out`, `hook_result` (each by its mean). Refused for RMSNorm
    and norm-free models, whose readers see the mean, so centring would change the model.
    """
    return _processed(model, [_center_writing_weights])


def center_unembed(model: "HookedTransformer") -> "HookedTransformer":
    """Remove the mean over the vocabulary from `W_U` (each row) and from `b_U`.

    Each position's logits shift by one constant (the mean logit), so log-probabilities,
    probabilities, the loss and logit differences are preserved exactly; logits are not.
    """
    return _processed(model, [_center_unembed])


def fold_value_biases(model: "HookedTransformer") -> "HookedTransformer":
    """Move each head's value bias into the output bias: `b_O += sum_h b_V[h] @ W_O[h]`.

    Every row of an attention pattern sums to one (the mask never leaves a query with no
    key), so `pattern @ (v + b_V) = pattern @ v + b_V`, and `b_V` reaches the output as the
    constant `b_V @ W_O`. Preserves: logits and `hook_attn_out` exactly. Changes:
    `hook_v`, `hook_z` and `hook_result` (they no longer include `b_V`).
    """
    return _processed(model, [_fold_value_biases])


def process_weights(
    model: "HookedTransformer",
    *,
    fold_ln: bool = True,
    center_writing_weights: bool = True,
    center_unembed: bool = True,
    fold_value_biases: bool = True,
) -> "HookedTransformer":
    """The usual processing for analysis, as a new model (TransformerLens's defaults).

    Applies, in order, each step that is asked for and that preserves this model's
    function: `fold_layer_norm` (skipped for a model without norms),
    `center_writing_weights` (skipped unless every norm is a LayerNorm), `center_unembed`,
    `fold_value_biases`. Logits change only by `center_unembed`'s per-position constant.
    """
    norm = model.cfg.normalization_type
    steps: list[Transform] = []
    if fold_ln and norm is not None:
        steps.append(_fold_layer_norm)
    if center_writing_weights and norm in _CENTRING_NORMS:
        steps.append(_center_writing_weights)
    if center_unembed:
        steps.append(_center_unembed)
    if fold_value_biases:
        steps.append(_fold_value_biases)
    return _processed(model, steps)


# ---------------------------------------------------------------------- state transforms
# Each reads and replaces entries of a float64 state dict and returns the config the new
# model is built from.


def _fold_layer_norm(state: State, cfg: HookedTransformerConfig) -> HookedTransformerConfig:
    if cfg.normalization_type is None:
        raise ValueError("fold_layer_norm: this model has no normalisation layers to fold")
    centre = cfg.normalization_type in _CENTRING_NORMS
    for layer in range(cfg.n_layers):
        prefix = f"blocks.{layer}"
        readers = [(f"{prefix}.attn.W_{kind}", f"{prefix}.attn.b_{kind}") for kind in "QKV"]
        _fold_into_readers(state, f"{prefix}.ln1", readers, centre)
        if cfg.has_mlp:
            _fold_into_readers(
                state, f"{prefix}.ln2", [(f"{prefix}.mlp.W_in", f"{prefix}.mlp.b_in")], centre
            )
    _fold_into_readers(state, "ln_final", [("unembed.W_U", "unembed.b_U")], centre)
    return cfg.replace(normalization_type=_PRE_FORM[cfg.normalization_type])


def _fold_into_readers(
    state: State, norm: str, readers: list[tuple[str, str]], centre: bool
) -> None:
    """Rewrite each `(w * x + b_norm) @ W + b` as `x @ W' + b'` (W is `[... d_model out]`)."""
    gain, bias = state.pop(f"{norm}.w", None), state.pop(f"{norm}.b", None)
    for W_name, b_name in readers:
        W = state[W_name]
        if bias is not None:
            state[b_name] = state[b_name] + einsum(bias, W, "d_model, ... d_model out -> ... out")
        if gain is not None:
            W = W * gain[:, None]
        # x is centred after a LayerNorm, so W's mean over d_model never reaches the output.
        state[W_name] = _centred(W, dim=-2) if centre else W


def _center_writing_weights(state: State, cfg: HookedTransformerConfig) -> HookedTransformerConfig:
    if cfg.normalization_type not in _CENTRING_NORMS:
        raise ValueError(
            f"center_writing_weights needs every reader of the residual stream to subtract "
            f"its mean (LayerNorm: normalization_type 'LN' or 'LNPre'), but this model has "
            f"normalization_type={cfg.normalization_type!r}: its readers see the mean, so "
            f"removing it would change what the model computes"
        )
    writers = ["embed.W_E", "pos_embed.W_pos"]
    for layer in range(cfg.n_layers):
        writers += [f"blocks.{layer}.attn.W_O", f"blocks.{layer}.attn.b_O"]
        if cfg.has_mlp:
            writers += [f"blocks.{layer}.mlp.W_out", f"blocks.{layer}.mlp.b_out"]
    for name in writers:
        if name in state:
            state[name] = _centred(state[name], dim=-1)
    return cfg


def _center_unembed(state: State, cfg: HookedTransformerConfig) -> HookedTransformerConfig:
    state["unembed.W_U"] = _centred(state["unembed.W_U"], dim=-1)
    state["unembed.b_U"] = _centred(state["unembed.b_U"], dim=-1)
    return cfg


def _fold_value_biases(state: State, cfg: HookedTransformerConfig) -> HookedTransformerConfig:
    for layer in range(cfg.n_layers):
        attn = f"blocks.{layer}.attn"
        b_V, W_O = state[f"{attn}.b_V"], state[f"{attn}.W_O"]
        folded = einsum(b_V, W_O, "head d_head, head d_head d_model -> d_model")
        state[f"{attn}.b_O"] = state[f"{attn}.b_O"] + folded
        state[f"{attn}.b_V"] = torch.zeros_like(b_V)
    return cfg


# ---------------------------------------------------------------------- building
def _processed(model: "HookedTransformer", steps: list[Transform]) -> "HookedTransformer":
    work_dtype = torch.float32 if model.cfg.device.startswith("mps") else torch.float64
    state = {name: t.detach().to(work_dtype, copy=True) for name, t in model.state_dict().items()}
    cfg = model.cfg
    for step in steps:
        cfg = step(state, cfg)
    # Building a model draws its initial weights; keep the caller's global RNG untouched.
    with torch.random.fork_rng(devices=[]):
        new = type(model)(cfg, tokenizer=model.tokenizer)
    load_checked_state_dict(new, state, source="processed weights")
    new.train(model.training)
    return new


def _centred(x: Tensor, dim: int) -> Tensor:
    return x - x.mean(dim=dim, keepdim=True)
