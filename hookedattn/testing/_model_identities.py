"""Which identities a model's forward has: block by block, in the order it computes them.

This module reads the model's structure (which norms, hook points and sublayers each block
has) and lists the identities of `hookedattn.testing.identities`'s docstring for it.
"""

from torch import Tensor

from hookedattn.core import names as _names
from hookedattn.core.components.norm import NoNorm
from hookedattn.core.model import HookedTransformer
from hookedattn.testing import _attention_identities as attn_ids
from hookedattn.testing import _differential_identities as diff_ids
from hookedattn.testing import _latent_identities as latent_ids
from hookedattn.testing import _moe_identities as moe_ids
from hookedattn.testing._identity import (
    TERMS,
    VALUE,
    Get,
    Identity,
    NormAtScale,
    Sides,
    activation,
    gated_activation,
    linear,
    per_head_copy,
    sum_of,
    weight,
)
from hookedattn.testing._mixer_identities import mixer_identities
from hookedattn.testing._norm_identities import input_norm_identities
from hookedattn.testing.published import Constants


def all_identities(model: HookedTransformer, constants: Constants) -> list[Identity]:
    """Every identity of `model`'s forward, in the order the forward computes them (the
    norms' last), with the attention scale and the norms' epsilon from `constants`."""
    cfg = model.cfg
    normed = cfg.normalization_placement == "post_residual" or cfg.embed_norm or cfg.normed_skip
    if normed or cfg.unembed_transform is not None:
        raise ValueError(
            "the residual identities listed here (resid_pre[0] = embed + pos_embed, resid_mid "
            "= resid_pre + attn_out, logits = ln_final(resid) W_U + b_U) do not hold where "
            "norms rescale the stream (normalization_placement='post_residual', embed_norm) "
            "or a head transform precedes W_U (unembed_transform); their identities are not "
            "written yet"
        )
    out: list[Identity] = []
    if not cfg.n_layers:
        return out
    terms = ["embed", "pos_embed"] if cfg.positional_embedding_type == "standard" else ["embed"]
    out.append(sum_of(_act("resid_pre", 0), *(_names.get_act_name(t) for t in terms)))
    for layer in range(cfg.n_layers):
        out += _block(model, layer, constants)
        if layer + 1 < cfg.n_layers:
            out.append(sum_of(_act("resid_pre", layer + 1), _act("resid_post", layer)))
    paths = [f"blocks.{layer}.{which}" for layer in range(cfg.n_layers) for which in _NORMS]
    out += input_norm_identities(model, constants)
    out += [_gain(model, path) for path in [*paths, "ln_final"] if _has_norm(model, path)]
    return out + _unembed(model)


# mlp.ln: solu_ln's or a sub-normed MLP's, over neurons; attn.sub_norm: over the heads' z;
# attn.q_a_norm, attn.kv_a_norm: latent attention's latents'
_NORMS = ("ln1", "ln2", "ln1_post", "ln2_post", "mlp.ln", "attn.sub_norm", "attn.q_a_norm",
          "attn.kv_a_norm")  # fmt: skip


def _has_norm(model: HookedTransformer, path: str) -> bool:
    try:
        return not isinstance(model.get_submodule(path), NoNorm)
    except AttributeError:  # a block without that norm (an attention-only block's ln2)
        return False


def _gain(model: HookedTransformer, path: str) -> Identity:
    """`<path>.hook_out == <path>.hook_normalized * w + b`: the gain and bias after the
    division (the identity for the weightless forms)."""
    module = model.get_submodule(path)
    normalized, out = f"{path}.hook_normalized", f"{path}.hook_out"
    gain, bias = getattr(module, "w", None), getattr(module, "b", None)

    def sides(get: Get) -> Sides:
        x = get(normalized)
        expected, size = x, x.abs()
        if gain is not None:
            expected, size = expected * weight(gain, x), size * weight(gain, x).abs()
        if bias is not None:
            expected, size = expected + weight(bias, x), size + weight(bias, x).abs()
        return Sides(get(out), expected, size)

    statement = f"{out} == {normalized} * w + b"
    axes = _names.axis_names(normalized) or ("batch", "pos", "d_model")
    return Identity(statement, (out, normalized), axes, TERMS, sides)


def _block(model: HookedTransformer, layer: int, constants: Constants) -> list[Identity]:
    """One block: its per-head copies, attention, MLP and residual sums.

    A sequential block adds the attention's write before the MLP reads the stream; a
    parallel one (`parallel_attn_mlp`) gives both sublayers `resid_pre` and adds both.
    """
    block = model.blocks[layer]
    resid_pre, resid_post = _act("resid_pre", layer), _act("resid_post", layer)
    out = []
    for copy in ("attn_in", "q_input", "k_input", "v_input"):
        if hasattr(block, f"hook_{copy}"):
            out.append(per_head_copy(_act(copy, layer), resid_pre))
    if hasattr(block, "hook_mixer_in"):
        out.append(sum_of(_act("mixer_in", layer), resid_pre))
    out += _mixing(model, layer, constants)
    # What the block's first sublayer adds: attention's or a mixer's, and a mixer's beside.
    writes = [_act("attn_out", layer)] if hasattr(block, "hook_attn_out") else []
    if hasattr(block, "hook_mixer_out"):
        writes.append(f"blocks.{layer}.hook_mixer_out")
    if not hasattr(block, "mlp"):  # attention-only, or a hybrid's block without an MLP
        return [*out, sum_of(resid_post, resid_pre, *writes)]
    mlp_out = _act("mlp_out", layer)
    if not hasattr(block, "hook_resid_mid"):  # parallel, or a hybrid's block of an MLP alone
        out += _mlp(model, layer, resid_pre)
        return [*out, sum_of(resid_post, resid_pre, *writes, mlp_out)]
    resid_mid = _act("resid_mid", layer)
    out.append(sum_of(resid_mid, resid_pre, *writes))
    out += _mlp(model, layer, resid_mid)
    writes = [resid_mid, mlp_out]
    if hasattr(block, "hook_per_layer_out"):  # Gemma 4's third write
        writes.append(f"blocks.{layer}.hook_per_layer_out")
    if not hasattr(block, "resid_scale"):
        return [*out, sum_of(resid_post, *writes)]
    unscaled = f"blocks.{layer}.resid_scale.hook_in"  # Gemma 4's block scalar
    return [*out, sum_of(unscaled, *writes), _scaled(resid_post, unscaled, block.resid_scale.w)]


def _scaled(out: str, x: str, w: Tensor) -> Identity:
    """`out == w * x`, `w` one number (a block's scalar, `components.resid_scale`)."""

    def sides(get: Get) -> Sides:
        x_ = get(x)
        expected = weight(w, x_) * x_
        return Sides(get(out), expected, expected.abs())

    statement = f"{out} == resid_scale.w * {x}"
    return Identity(statement, (out, x), _names.axis_names(out), VALUE, sides)


def _mixing(model: HookedTransformer, layer: int, constants: Constants) -> list[Identity]:
    """The identities of what mixes positions in block `layer`: its attention, a hybrid's
    mixer in attention's place or beside it, or nothing (a block of an MLP alone)."""
    block = model.blocks[layer]
    out = _attention(model, layer, constants.attn_scale) if hasattr(block, "attn") else []
    if hasattr(block, "mixer"):
        out += mixer_identities(model, layer, beside=hasattr(block, "attn"))
    return out


def _attention(model: HookedTransformer, layer: int, attn_scale: float) -> list[Identity]:
    cfg, attn = model.cfg, model.blocks[layer].attn
    prefix = f"blocks.{layer}.attn"
    # A block reading an earlier block's keys and values (`n_kv_shared_layers`): theirs.
    own = cfg.kv_source_layer(layer) is None
    kv = layer if own else cfg.kv_source_layer(layer)
    q, k = _act("q", layer), _act("k", kv)
    out = [*_projections(model, layer)]
    rotates = cfg.layer_rotates(layer)
    if rotates and cfg.qk_norm_after_rotary:  # the norms read the rotated q and k
        q, k = _act("rot_q", layer), _act("rot_k", kv)
    for name, which in ((q, "q_norm"), (k, "k_norm"))[: 2 if own else 1]:
        out += _norm_identity(model, f"{prefix}.{which}", name)
    if rotates and not cfg.qk_norm_after_rotary:
        q, k = _act("rot_q", layer), _act("rot_k", kv)
    elif cfg.layer_norms_qk(layer):
        q, k = f"{prefix}.q_norm.hook_out", f"blocks.{kv}.attn.k_norm.hook_out"
    if hasattr(attn, "hook_q_tuned"):  # the queries scaled by position: what the scores read
        q = f"{prefix}.hook_q_tuned"
    v, z, result = _act("v", kv), _act("z", layer), _act("result", layer)
    if cfg.use_v_norm:  # the heads read the normed values (Gemma 4)
        v = f"blocks.{kv}.attn.v_norm.hook_out"
    scores, pattern = _act("attn_scores", layer), _act("pattern", layer)
    attn_out = _act("attn_out", layer)
    slopes = attn.alibi.slopes if hasattr(attn, "alibi") else None
    cap = cfg.attn_scores_soft_cap
    out.append(attn_ids.scores(scores, q, k, attn_scale, attn.group, cap, slopes))
    if attn.sinks is None:
        out += [attn_ids.softmax(pattern, scores), attn_ids.rows_sum_to_one(pattern)]
    else:  # a sink takes its share of every row
        out.append(moe_ids.sink_softmax(pattern, scores, attn.sinks))
    out.append(attn_ids.causal(pattern))
    if attn.attn_type == "local":
        out.append(attn_ids.windowed(pattern, cfg.window_size))
    gate = f"{prefix}.hook_attn_gate" if cfg.attn_gate is not None else None
    out += _mixed(model, layer, z, pattern, v, gate)
    post = _placed_norm(model, layer, "ln1_post")
    if hasattr(attn, "hook_result"):
        out.append(attn_ids.heads_sum(attn_out, result, attn.b_O, post))
    if cfg.attn_sub_norm:  # W_O reads the heads' z normed together
        out.append(sum_of(_act("z_normed", layer), f"{prefix}.sub_norm.hook_out"))
    if cfg.attn_sub_norm or cfg.differential_attention:
        z = _act("z_normed", layer)
    out.append(
        linear(attn_out, z, attn.W_O, attn.b_O, _WRITE, "W_O + b_O, summed over heads", post)
    )
    return out


def _mixed(
    model: HookedTransformer, layer: int, z: str, pattern: str, v: str, gate: str | None
) -> list[Identity]:
    """`z == pattern @ v` (times the gate); differential attention's `z` mixes paired
    values, and its pairs are subtracted, normed and scaled (`_differential_identities`)."""
    attn = model.blocks[layer].attn
    if not model.cfg.differential_attention:
        return [attn_ids.mix_values(z, pattern, v, attn.group, gate)]
    z_diff, norm = _act("z_diff", layer), f"blocks.{layer}.attn.z_norm"
    return [
        diff_ids.paired_mix(z, pattern, v, attn.group),
        diff_ids.differential(z_diff, z, attn),
        *_norm_identity(model, norm, z_diff),
        diff_ids.scaled(_act("z_normed", layer), f"{norm}.hook_out", 1 - attn.lambda_init),
    ]


_READ = "... d_model, head d_model d_head -> ... head d_head"
_READ_PER_HEAD = "... head d_model, head d_model d_head -> ... head d_head"
_WRITE = "... head d_head, head d_head d_model -> ... d_model"


def _projections(model: HookedTransformer, layer: int) -> list[Identity]:
    """`q, k, v == input @ W_Q, W_K, W_V (+ biases)`, where the input is unambiguous.

    Keys and values are checked against the weights as stored, one per key/value head.
    With `use_split_qkv_input` and a norm, `ln1` runs three times (on the q, k and v
    inputs) and its hook point records only the last, so those are not checked.
    """
    block = model.blocks[layer]
    split = hasattr(block, "hook_q_input")
    normed = not isinstance(block.ln1, NoNorm)
    if split and normed:
        return []
    if model.cfg.is_latent_attention:  # one shared input, through ln1
        source = f"blocks.{layer}.ln1.hook_out" if normed else _act("resid_pre", layer)
        return latent_ids.projections(model, layer, source)
    weights = {"q": (block.attn.W_Q, block.attn.b_Q)}
    if model.cfg.kv_source_layer(layer) is None:  # else its keys and values are another's
        W_K, b_K, W_V, b_V = block.attn.key_value_weights()
        weights |= {"k": (W_K, b_K), "v": (W_V, b_V)}
    per_head = split or hasattr(block, "hook_attn_in")
    out = []
    for x, (W, b) in weights.items():
        if normed:
            source = f"blocks.{layer}.ln1.hook_out"
        elif split:
            source = _act(f"{x}_input", layer)
        else:
            source = _act("attn_in" if hasattr(block, "hook_attn_in") else "resid_pre", layer)
        pattern = _READ_PER_HEAD if per_head else _READ
        label = f"W_{x.upper()} + b_{x.upper()}"
        # A shortformer's queries and keys read the positions too (its values do not).
        shortformer = model.cfg.positional_embedding_type == "shortformer" and x != "v"
        added = _names.get_act_name("pos_embed") if shortformer else None
        out.append(linear(_act(x, layer), source, W, b, pattern, label, added=added))
    return out


def _mlp(model: HookedTransformer, layer: int, stream: str) -> list[Identity]:
    """The MLP of block `layer`, which reads the residual stream `stream`."""
    block = model.blocks[layer]
    mlp = block.mlp
    pre, post, mlp_out = _act("pre", layer), _act("post", layer), _act("mlp_out", layer)
    out = []
    if hasattr(block, "hook_mlp_in"):
        out.append(sum_of(_act("mlp_in", layer), stream))
        stream = _act("mlp_in", layer)
    if not isinstance(block.ln2, NoNorm):
        stream = f"blocks.{layer}.ln2.hook_out"
    if model.cfg.moe_beside_mlp:
        return [*out, *_experts_beside_dense(model, layer)]
    if model.cfg.layer_is_moe(layer):
        return [*out, *moe_ids.moe(mlp, layer, stream, _placed_norm(model, layer, "ln2_post"))]
    read = "... d_model, d_model d_mlp -> ... d_mlp"
    if hasattr(mlp, "W_gate"):
        pre_linear = _act("pre_linear", layer)
        out.append(
            linear(pre, stream, mlp.W_gate, getattr(mlp, "b_gate", None), read, "W_gate + b_gate")
        )
        out.append(linear(pre_linear, stream, mlp.W_in, mlp.b_in, read, "W_in + b_in"))
        if hasattr(mlp, "hook_mid"):  # a sub-normed MLP: its neurons normed
            out.append(gated_activation(_act("mid", layer), pre, pre_linear, mlp.act_fn))
            out.append(sum_of(post, f"blocks.{layer}.mlp.ln.hook_out"))
        else:
            out.append(gated_activation(post, pre, pre_linear, mlp.act_fn))
    elif hasattr(mlp, "hook_mid"):  # solu_ln: the norm over the neurons after SoLU
        mid = _act("mid", layer)
        out.append(linear(pre, stream, mlp.W_in, mlp.b_in, read, "W_in + b_in"))
        out.append(activation(mid, pre, mlp.act_fn))
        out.append(sum_of(post, f"blocks.{layer}.mlp.ln.hook_out"))
    else:
        out.append(linear(pre, stream, mlp.W_in, mlp.b_in, read, "W_in + b_in"))
        out.append(activation(post, pre, mlp.act_fn))
    write = "... d_mlp, d_mlp d_model -> ... d_model"
    placed = _placed_norm(model, layer, "ln2_post")
    out.append(linear(mlp_out, post, mlp.W_out, mlp.b_out, write, "W_out + b_out", placed))
    return out


def _experts_beside_dense(model: HookedTransformer, layer: int) -> list[Identity]:
    """Gemma 4's MLP sublayer (`moe_beside_mlp`): the mixture reading `ln2_moe`, routed by
    `ln_router`, written through `ln2_moe_post`; the sublayer's write `ln2_post` of the
    dense MLP's and the mixture's writes. (The dense MLP is a plain gated one.)"""
    b = f"blocks.{layer}"
    mixture = moe_ids.moe(
        model.blocks[layer].mlp, layer, f"{b}.ln2_moe.hook_out",
        _placed_norm(model, layer, "ln2_moe_post"), f"{b}.ln_router.hook_out", f"{b}.hook_moe_out",
    )  # fmt: skip
    post, mlp_out = _placed_norm(model, layer, "ln2_post"), _act("mlp_out", layer)
    dense, experts = f"{b}.hook_dense_out", f"{b}.hook_moe_out"

    def sides(get: Get) -> Sides:
        total, size = get(dense) + get(experts), get(dense).abs() + get(experts).abs()
        total, size = post.apply(get, total, size)
        return Sides(get(mlp_out), total, size)

    statement = f"{mlp_out} == {post.path}({dense} + {experts})"
    needs = (mlp_out, dense, experts, post.scale)
    return [*mixture, Identity(statement, needs, _names.axis_names(mlp_out), TERMS, sides)]


def _unembed(model: HookedTransformer) -> list[Identity]:
    """What the unembedding reads (the final norm's output) and the logits it returns."""
    final = _act("resid_post", model.cfg.n_layers - 1)
    read = final if isinstance(model.ln_final, NoNorm) else "ln_final.hook_out"
    out = [sum_of("unembed.hook_in", read)]
    unembed = model.unembed
    cap = model.cfg.output_logits_soft_cap
    logits = linear(
        "unembed.hook_out",
        "unembed.hook_in",
        unembed.W_U,
        unembed.b_U,
        "... d_model, d_model d_vocab_out -> ... d_vocab_out",
        "W_U + b_U" if cap is None else "W_U + b_U, soft-capped",
        cap=cap,
    )
    return [*out, logits]


def _act(name: str, layer: int) -> str:
    return _names.get_act_name(name, layer)


def _placed_norm(model: HookedTransformer, layer: int, which: str) -> NormAtScale | None:
    """The norm `which` of block `layer` (`ln1_post`...), or None where it is the identity."""
    module = getattr(model.blocks[layer], which, None)
    if module is None or isinstance(module, NoNorm):
        return None
    return NormAtScale(f"blocks.{layer}.{which}", module)


def _norm_identity(model: HookedTransformer, path: str, x: str) -> list[Identity]:
    """`<path>.hook_normalized` and `<path>.hook_out` are norm(x) before and after the gain
    and bias, at its recorded scale; none where there is no norm."""
    if not _has_norm(model, path):  # NoNorm, or none at all (latent attention's q/k)
        return []
    module = model.get_submodule(path)
    norm = NormAtScale(path, module)
    axes = _names.axis_names(x)

    def identity(hook: str, affine: bool, what: str) -> Identity:
        def sides(get: Get) -> Sides:
            x_ = get(x)
            expected, size = norm.apply(get, x_, x_.abs(), affine)
            return Sides(get(hook), expected, size)

        statement = f"{hook} == {path}({x}){what} at its recorded hook_scale"
        return Identity(statement, (hook, x, norm.scale), axes, TERMS, sides)

    return [
        identity(f"{path}.hook_normalized", False, " before its gain"),
        identity(f"{path}.hook_out", True, ""),
    ]
