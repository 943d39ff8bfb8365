"""Weight processing: new models whose weights read more simply and compute the same thing.

Each function returns a NEW model (the input is never changed; hooks are not carried
over; the tokenizer and train/eval mode are) and says exactly what it preserves:

    fold_layer_norm         logits and every activation except the norms' `hook_out`
    center_writing_weights  logits and normalised activations; the residual stream loses
                            its mean component (LayerNorm models only)
    center_unembed          log-probabilities; logits shift by a constant per position
    fold_value_biases       logits; `hook_v`, `hook_z`, `hook_result` lose `b_V`
    process_weights         all of the above that apply, in that order (TransformerLens's
                            `process_weights_`, without mutating anything)

The arithmetic runs in float64 and is cast back once, so a float32 model changes by one
rounding, not by the rounding of each step.

On the composed block shapes: an RMSNorm's gain (Gemma's `1 + w`, stored as `w`) folds
like a LayerNorm's; grouped keys and values fold into the stored `_W_K`, `_W_V` (`_b_K`,
`_b_V`), and a gated MLP's norm into both `W_gate` and `W_in`. A mixture of experts' norm
folds into every reader of its output: the router (`W_router`, `b_router`: the logits, so
the routing, are unchanged) and each expert's `W_gate`, `W_in` (with their biases), and a
shared expert's; `center_writing_weights` centres every expert's `W_out`, `b_out` (the
mixture of centred writes is centred, whatever the weights). `fold_value_biases` is refused
with attention sinks: a row of the pattern then sums to less than one, so `b_V` reaches the
output scaled by each query's own row sum, not as a constant; and with an output gate
(`attn_gate`), which scales it by each query's gate. The gate reads the attention's input,
so `ln1` folds into `W_G`, `b_G` as into `W_Q`. What no weight can absorb is
refused by name: a norm after a sublayer (`normalization_placement` "post" or
"pre_and_post"; its divisor depends on the sublayer's output), a LayerNorm bias before a
gated MLP (`W_gate` has no bias to take it), and centring the unembedding under a soft cap
on the logits (the cap does not commute with the shift). Norms of queries and keys
(`use_qk_norm`) sit after the projections and keep their gains; folding the residual norms
before them leaves their inputs unchanged. In a hybrid model the norm before a mixer folds
into the maps by which it reads the stream, and its `W_out`, `b_out` are centred with the
other writing weights.

The two variants of TransformerLens's toy models, as TransformerLens 3.5.1 processes them:

- `act_fn="solu_ln"`: the LayerNorm over the neurons folds like the others, into the
  weights that read its output: `W_out` takes its gain (and is centred over the neurons,
  whose normalised values have zero mean), `b_out` its bias (`b @ W_out`); the norm
  becomes weightless with the rest (`LN` -> `LNPre`).
- `positional_embedding_type="shortformer"`: `W_pos` is added after `ln1`'s gain and bias,
  to the query and key inputs only, and no weight takes `ln1` across that sum; nor is
  `W_pos` a writing weight. TransformerLens's `from_pretrained` therefore turns
  `fold_ln`, `center_writing_weights` and `center_unembed` off for these models (its
  `process_weights_` does not, and then folds `ln1` into `W_Q`, `W_K` and centres
  `W_pos`, which changes what the model computes). Here `fold_layer_norm` and
  `center_writing_weights` refuse a shortformer model, naming it, and `process_weights`
  skips them; `center_unembed` and `fold_value_biases` are exact for it and apply
  (`hookedattn_tl`'s `from_pretrained` turns `center_unembed` off as TL's does).
"""

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from einops import einsum, rearrange
from torch import Tensor

from hookedattn.core._norm_readers import attn_readers, mixer_readers, mlp_readers
from hookedattn.core._weights_io import load_checked_state_dict
from hookedattn.core.config import HookedTransformerConfig

if TYPE_CHECKING:
    from hookedattn.core.model import HookedTransformer

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

    A `solu_ln` MLP's norm over the neurons folds into `W_out`, `b_out` the same way.

    Preserves: logits exactly, and every activation except the norms' `hook_out` (now
    equal to `hook_normalized`, the stream before the gain and bias, itself unchanged). A
    model already in a `Pre` form is accepted (its reading weights are centred, if
    LayerNorm). A model without norms is refused, and so
    is one whose norms cannot all be folded (module docstring): norms after the
    sublayers, a LayerNorm bias before a gated MLP, or shortformer positions (added after
    `ln1`).
    """
    return _processed(model, [_fold_layer_norm])


def center_writing_weights(model: "HookedTransformer") -> "HookedTransformer":
    """Remove the mean over `d_model` from every weight and bias that writes to the stream.

    `W_E`, `W_pos`, `W_O`, `b_O`, `W_out`, `b_out` are centred, so the residual stream has
    zero mean (where the embeddings are `d_embed` wide, their projection's `W_proj` and
    `b_proj` in place of `W_E` and `W_pos`). Preserves the logits and every norm's output
    exactly, because every reader of the stream is a LayerNorm, which subtracts the mean
    first: `LN(x + c) = LN(x)` for a constant vector `c`. Changes: `hook_embed`,
    `hook_pos_embed` (not where a projection follows them), `hook_resid_*`, `hook_attn_out`,
    `hook_mlp_out`, `hook_result` (each by its mean). Refused for RMSNorm
    and norm-free models, whose readers see the mean, so centring would change the model;
    for norms after the sublayers, which stand between `W_O`, `W_out` and the stream; and
    for shortformer positions (`W_pos` is read by the queries and keys after `ln1`, where
    its mean is not removed; TransformerLens leaves these models uncentred).
    """
    return _processed(model, [_center_writing_weights])


def center_unembed(model: "HookedTransformer") -> "HookedTransformer":
    """Remove the mean over the vocabulary from `W_U` (each row) and from `b_U`.

    Each position's logits shift by one constant (the mean logit), so log-probabilities,
    probabilities, the loss and logit differences are preserved exactly; logits are not.
    Refused for a model with a soft cap on its logits (`output_logits_soft_cap`): `c
    tanh((l - m) / c)` is not `c tanh(l / c)` shifted, so probabilities would change.
    """
    return _processed(model, [_center_unembed])


def fold_value_biases(model: "HookedTransformer") -> "HookedTransformer":
    """Move each head's value bias into the output bias: `b_O += sum_h b_V[h] @ W_O[h]`.

    Every row of an attention pattern sums to one (the mask never leaves a query with no
    key), so `pattern @ (v + b_V) = pattern @ v + b_V`, and `b_V` reaches the output as the
    constant `b_V @ W_O`. With grouped-query attention each key/value head's bias is summed
    over the query heads that read it. Preserves: logits and `hook_attn_out` exactly (a
    norm after the attention sees the same input). Changes: `hook_v`, `hook_z` and
    `hook_result` (they no longer include `b_V`). Refused with attention sinks (module
    docstring). A block reading an earlier block's values (`n_kv_shared_layers`) folds
    that block's `b_V` into its own `b_O`.
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
    function: `fold_layer_norm` (skipped for a model without norms, with norms it cannot
    fold, or with shortformer positions), `center_writing_weights` (skipped unless every
    reader of the stream is a LayerNorm, no norm follows a sublayer and the positions are
    not shortformer), `center_unembed` (skipped under a soft cap on the logits),
    `fold_value_biases` (skipped with attention sinks, an output gate, a sub-norm of the
    heads' z or differential attention's norm of each pair, and for latent attention,
    which has no value bias). Logits change only by `center_unembed`'s per-position
    constant.
    """
    cfg = model.cfg
    steps: list[Transform] = []
    if fold_ln and _unfoldable(cfg) is None:
        steps.append(_fold_layer_norm)
    if center_writing_weights and _uncentrable(cfg) is None:
        steps.append(_center_writing_weights)
    if center_unembed and cfg.output_logits_soft_cap is None:
        steps.append(_center_unembed)
    unfoldable = (cfg.use_attn_sinks or cfg.is_latent_attention or cfg.attn_gate
                  or cfg.differential_attention)  # fmt: skip
    if fold_value_biases and not (unfoldable or cfg.attn_sub_norm):
        steps.append(_fold_value_biases)
    return _processed(model, steps)


# ---------------------------------------------------------------------- state transforms
# Each reads and replaces entries of a float64 state dict and returns the config the new
# model is built from.


def _unfoldable(cfg: HookedTransformerConfig) -> str | None:
    """Why the norms of a model with this config cannot be folded, or None if they can."""
    if cfg.normalization_type is None:
        return "this model has no normalisation layers to fold"
    if cfg.positional_embedding_type == "shortformer":
        return (
            "this model has shortformer positional embeddings (positional_embedding_type="
            "'shortformer'): W_pos is added after ln1's gain and bias, to the query and key "
            "inputs only, so no weight can take ln1's gain across that sum (TransformerLens's "
            "from_pretrained turns fold_ln off for these models)"
        )
    if cfg.embed_norm or cfg.unembed_transform is not None:
        return (
            "the norm of the embeddings (embed_norm, ln_embed) or of the head transform "
            "(unembed_transform, ln_unembed) reads no weight matrix that could take its "
            "gain and bias: folding would drop them"
        )
    if cfg.normalization_placement == "post_residual":
        return (
            "normalization_placement='post_residual' norms the stream after each add "
            "(ln_resid_mid, ln_resid_post): a post-residual norm rescales the stream by a "
            "divisor of the sum, which no weight can absorb (only placement 'pre' folds)"
        )
    if cfg.normed_skip:
        return (
            "normed_skip: the normed stream passes each sublayer by its skip (MiniMax's "
            "scaled skips), so the norm's gain scales the stream itself, not only weights "
            "that read it: no weight can absorb it"
        )
    if cfg.placements != ("pre",):
        return (
            f"{_after(cfg)} puts a norm after each sublayer (ln1_post, ln2_post), whose "
            "divisor depends on the sublayer's own output: no weight can absorb it (only "
            "placement 'pre' folds)"
        )
    inside = [f for f in ("attn_sub_norm", "mlp_sub_norm", "moe_out_norm") if getattr(cfg, f)]
    if inside:
        return (
            f"{', '.join(inside)}: a norm inside a sublayer or after a mixture of experts, "
            f"whose divisor depends on the sublayer's own values; its gain is not folded here "
            f"and the weightless form would drop it"
        )
    # A mixture's experts have a gate bias; a dense gated MLP, and a shared expert, not.
    gate_without_bias = (not cfg.is_moe and not cfg.mlp_gate_bias) or cfg.d_mlp_shared is not None
    if cfg.gated_mlp and cfg.normalization_type == "LN" and gate_without_bias:
        return (
            "a LayerNorm bias before a gated MLP reaches W_gate, which has no bias to take "
            "it (normalization_type='LN' with gated_mlp=True)"
        )
    if cfg.index_topk is not None and cfg.normalization_type == "LN":
        return (
            "a LayerNorm bias before a lightning indexer reaches its W_IK and W_IW, which "
            "have no bias to take it (normalization_type='LN' with index_topk)"
        )
    return None


def _after(cfg: HookedTransformerConfig) -> str:
    """The field that places a norm after a sublayer, named with its value (and the blocks
    it places so, where `placement_layers` places each block's norms)."""
    placement = next(p for p in cfg.placements if p != "pre")
    if cfg.placement_layers is None:
        return f"normalization_placement={placement!r}"
    blocks = [i for i, p in enumerate(cfg.placement_layers) if p == placement]
    return f"placement_layers {placement!r} in blocks {blocks}"


def _fold_layer_norm(state: State, cfg: HookedTransformerConfig) -> HookedTransformerConfig:
    why = _unfoldable(cfg)
    if why is not None:
        raise ValueError(f"fold_layer_norm: {why}")
    centre = cfg.normalization_type in _CENTRING_NORMS
    for layer in range(cfg.n_layers):
        attn, mlp = f"blocks.{layer}.attn", f"blocks.{layer}.mlp"
        readers = attn_readers(cfg, attn, state)
        if cfg.layer_mixer(layer) != "attention":
            readers = []
        if cfg.mixers is not None:  # in attention's place, or beside it (Falcon-H1)
            readers = readers + mixer_readers(cfg, layer)
        # An MLP-only block has no ln1; nor has a block whose ln1_layers flag is off.
        if cfg.layer_mixer(layer) != "none" and cfg.layer_norms_attn_input(layer):
            _fold_into_readers(state, f"blocks.{layer}.ln1", readers, centre)
        if cfg.layer_has_mlp(layer):
            readers = mlp_readers(cfg, mlp, cfg.layer_is_moe(layer))
            _fold_into_readers(state, f"blocks.{layer}.ln2", readers, centre)
        if cfg.layer_has_mlp(layer) and cfg.act_fn == "solu_ln":
            _fold_neuron_norm(state, mlp)
    _fold_into_readers(state, "ln_final", [("unembed.W_U", "unembed.b_U")], centre)
    return cfg.replace(normalization_type=_PRE_FORM[cfg.normalization_type])


def _fold_neuron_norm(state: State, mlp: str) -> None:
    """A `solu_ln` MLP's norm over the neurons into the weights that read it: `(w * x + b)
    @ W_out + b_out = x @ (w[:, None] * W_out) + (b @ W_out + b_out)`, then `W_out` centred
    over the neurons (x, a LayerNorm's output before its gain, has zero mean over them).

    The norm is a LayerNorm whatever the model's `normalization_type` (weightless unless
    "LN": then there is only the centring to do).
    """
    gain, bias = state.pop(f"{mlp}.ln.w", None), state.pop(f"{mlp}.ln.b", None)
    W_out = state[f"{mlp}.W_out"]
    if bias is not None:
        state[f"{mlp}.b_out"] = state[f"{mlp}.b_out"] + einsum(
            bias, W_out, "d_mlp, d_mlp d_model -> d_model"
        )
    if gain is not None:
        W_out = W_out * gain[:, None]
    state[f"{mlp}.W_out"] = _centred(W_out, dim=-2)


def _fold_into_readers(
    state: State, norm: str, readers: list[tuple[str, str | None]], centre: bool
) -> None:
    """Rewrite each `(w * x + b_norm) @ W + b` as `x @ W' + b'` (W is `[... d_model out]`).

    A reader without a bias (`W_gate`) takes the gain only; `_unfoldable` has refused a
    norm bias it would have to take.
    """
    gain, bias = state.pop(f"{norm}.w", None), state.pop(f"{norm}.b", None)
    for W_name, b_name in readers:
        W = state[W_name]
        if bias is not None and b_name is not None:
            state[b_name] = state[b_name] + einsum(bias, W, "d_model, ... d_model out -> ... out")
        if gain is not None:
            W = W * gain[:, None]
        # x is centred after a LayerNorm, so W's mean over d_model never reaches the output.
        state[W_name] = _centred(W, dim=-2) if centre else W


def _uncentrable(cfg: HookedTransformerConfig) -> str | None:
    """Why centring the writing weights would change this model, or None if it would not."""
    if cfg.normalization_type not in _CENTRING_NORMS:
        return (
            f"center_writing_weights needs every reader of the residual stream to subtract "
            f"its mean (LayerNorm: normalization_type 'LN' or 'LNPre'), but this model has "
            f"normalization_type={cfg.normalization_type!r}: its readers see the mean, so "
            f"removing it would change what the model computes"
        )
    if cfg.ln1_layers is not None and not all(cfg.ln1_layers):
        return (
            f"center_writing_weights: the blocks whose ln1_layers flag is off "
            f"({[i for i, f in enumerate(cfg.ln1_layers) if not f]}) read the residual "
            f"stream without a norm: they see its mean, so removing it would change them"
        )
    if cfg.positional_embedding_type == "shortformer":
        return (
            "center_writing_weights: this model has shortformer positional embeddings "
            "(positional_embedding_type='shortformer'): W_pos is added to the query and key "
            "inputs after ln1, where its mean is not removed, and TransformerLens leaves "
            "every writing weight of these models uncentred (its from_pretrained turns "
            "center_writing_weights off for them)"
        )
    if cfg.normalization_placement == "post_residual":
        return (
            "center_writing_weights: with normalization_placement='post_residual' each "
            "sublayer's write is added to the stream before a norm that centres the sum "
            "itself; a post-residual norm rescales the stream, so centring the writes is "
            "neither needed nor a fold of anything"
        )
    if cfg.moe_out_norm:
        return (
            "center_writing_weights: with moe_out_norm a norm after the mixture of experts "
            "writes to the stream (ln2_post), not W_out, and its output is not centred"
        )
    if cfg.placements != ("pre",):
        return (
            f"center_writing_weights: with {_after(cfg)} a norm after each sublayer "
            "writes to the stream, not W_O or W_out, and its output is not centred"
        )
    return None


def _center_writing_weights(state: State, cfg: HookedTransformerConfig) -> HookedTransformerConfig:
    why = _uncentrable(cfg)
    if why is not None:
        raise ValueError(why)
    writers = ["embed.W_E", "pos_embed.W_pos"]
    if cfg.d_embed is not None:  # the embeddings reach the stream through their projection
        writers = ["embed_proj.W_proj", "embed_proj.b_proj"]
    for layer in range(cfg.n_layers):
        writers += [f"blocks.{layer}.attn.W_O", f"blocks.{layer}.attn.b_O"]
        writers += [f"blocks.{layer}.mixer.W_out", f"blocks.{layer}.mixer.b_out"]  # a hybrid's
        if cfg.has_mlp:
            writers += [f"blocks.{layer}.mlp.W_out", f"blocks.{layer}.mlp.b_out"]
            shared = f"blocks.{layer}.mlp.shared_expert"
            writers += [f"{shared}.W_out", f"{shared}.b_out"]  # where there is one
    for name in writers:
        if name in state:
            state[name] = _centred(state[name], dim=-1)
    return cfg


def _center_unembed(state: State, cfg: HookedTransformerConfig) -> HookedTransformerConfig:
    if cfg.output_logits_soft_cap is not None:
        raise ValueError(
            f"center_unembed: this model soft-caps its logits (output_logits_soft_cap="
            f"{cfg.output_logits_soft_cap:g}), and c*tanh((logits - mean)/c) is not the capped "
            f"logits shifted by a constant: probabilities would change"
        )
    state["unembed.W_U"] = _centred(state["unembed.W_U"], dim=-1)
    state["unembed.b_U"] = _centred(state["unembed.b_U"], dim=-1)
    return cfg


def _fold_value_biases(state: State, cfg: HookedTransformerConfig) -> HookedTransformerConfig:
    if cfg.use_attn_sinks:
        raise ValueError(
            "fold_value_biases: with attention sinks (use_attn_sinks=True) a row of the "
            "pattern sums to less than one, so b_V reaches the output scaled by each query's "
            "row sum: it is not a constant that b_O could take"
        )
    if cfg.attn_sub_norm:
        raise ValueError(
            "fold_value_biases: with attn_sub_norm the heads' z (b_V included) are normed "
            "together before W_O, so b_V @ W_O is not a constant that b_O could take"
        )
    if cfg.differential_attention:
        raise ValueError(
            "fold_value_biases: with differential_attention each pair of heads' z (b_V "
            "included) is RMS-normed before W_O, so b_V @ W_O is not a constant that b_O "
            "could take"
        )
    if cfg.attn_gate is not None:
        raise ValueError(
            f"fold_value_biases: with an output gate (attn_gate={cfg.attn_gate!r}) b_V "
            "reaches the output multiplied by each query's gate: it is not a constant that "
            "b_O could take"
        )
    if cfg.is_latent_attention:
        return cfg  # its values have no bias to fold
    folded_biases = set()
    for layer in range(cfg.n_layers):
        if cfg.layer_mixer(layer) != "attention":
            continue  # a hybrid's mixer: no values
        attn = f"blocks.{layer}.attn"
        source = cfg.kv_source_layer(layer)  # a block reading another's values: its b_V
        of = attn if source is None else f"blocks.{source}.attn"
        name = f"{of}._b_V" if f"{of}._b_V" in state else f"{of}.b_V"
        b_V, W_O = state[name], state[f"{attn}.W_O"]
        # Query head h reads key/value head h // group: W_O's heads, grouped that way.
        W_O = rearrange(
            W_O, "(kv_head group) d_head d_model -> kv_head group d_head d_model", kv_head=len(b_V)
        )
        folded = einsum(b_V, W_O, "kv_head d_head, kv_head group d_head d_model -> d_model")
        state[f"{attn}.b_O"] = state[f"{attn}.b_O"] + folded
        folded_biases.add(name)
    for name in folded_biases:  # after every block reading them has folded them
        state[name] = torch.zeros_like(state[name])
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
    new.checkpoint_config = model.checkpoint_config
    return new


def _centred(x: Tensor, dim: int) -> Tensor:
    return x - x.mean(dim=dim, keepdim=True)
