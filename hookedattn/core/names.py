"""Hook names: the one place that spells them and expands shorthand.

Full names follow TransformerLens 3.x (`blocks.0.attn.hook_pattern`). Shorthand is a short
name plus a layer and, for the per-block norms, which one: `("pattern", 0)`,
`("resid_pre", -1)`, `("scale", 1, "ln2")`; `"scale"` alone is the final norm's scale.
Nothing outside this module parses a hook-name string. A head's label, `"L1H2"`, is spelled
here too (`head_label`), for the model's views and the analysis results alike.
"""

import difflib
import re
from collections.abc import Iterable

# Reached as a namespace, `hookedattn.core.names.get_act_name` (also exported by `hookedattn`).
__all__ = [
    "NORM_SITES",
    "axis_names",
    "expand_key",
    "expert_of",
    "get_act_name",
    "head_label",
    "is_rows",
    "layer_of",
    "pos_axis",
    "short_names",
    "unknown_name_message",
]

# short name -> (template, what the layer_type argument may be)
_BLOCK = "blocks.{layer}.hook_{name}"
_ATTN = "blocks.{layer}.attn.hook_{name}"
_MLP = "blocks.{layer}.mlp.hook_{name}"
_NORM = "blocks.{layer}.{layer_type}.hook_{name}"
# The query and key norms (Qwen 3, OLMo 2, Gemma 3): `q_norm_out` is the normalised queries
# that the rotation (or the scores) reads.
_QK_NORM = "blocks.{layer}.attn.{site}.hook_{part}"
# One expert of a mixture of experts, on the rows of its tokens: ("expert_out", 0, 3) is
# expert 3 of block 0. A shared expert (Qwen2-MoE) is a gated MLP: ("shared_post", 0).
_EXPERT = "blocks.{layer}.mlp.experts.{expert}.hook_{part}"
_SHARED = "blocks.{layer}.mlp.shared_expert.hook_{part}"
_INDEXER = "blocks.{layer}.attn.indexer.hook_{name}"
_EXPERT_PARTS = ("in", "pre", "pre_linear", "post", "out")

_TEMPLATES: dict[str, str] = {
    **{n: _BLOCK for n in ("resid_pre", "resid_mid", "resid_post", "attn_out", "mlp_out")},
    **{n: _BLOCK for n in ("mlp_in", "mixer_in", "attn_in", "q_input", "k_input", "v_input")},
    **{n: _ATTN for n in ("q", "k", "v", "z", "z_normed", "result", "rot_q", "rot_k", "q_tuned")},
    "z_diff": _ATTN,  # differential attention's pairs of heads, subtracted
    **{n: _ATTN for n in ("attn_scores", "pattern")},
    # Latent attention's latents (after their norms) and its shared rotary key.
    **{n: _ATTN for n in ("q_latent", "kv_latent", "k_rope")},
    # A lightning indexer's queries, keys, head weights and scores (`components.indexer`).
    **{f"index_{part}": _INDEXER for part in ("q", "k", "weights", "scores")},
    **{n: _MLP for n in ("pre", "pre_linear", "mid", "post")},  # mid: solu_ln's, before its ln
    **{
        n: _MLP
        for n in ("router_logits", "expert_indices", "expert_weights", "shared_gate", "shared_out")
    },
    **{f"expert_{part}": _EXPERT for part in _EXPERT_PARTS},
    **{f"shared_{part}": _SHARED for part in ("pre", "pre_linear", "post")},
    **{n: _NORM for n in ("scale", "normalized")},
    **{
        f"{site}_{part}": _QK_NORM
        for site in ("q_norm", "k_norm", "v_norm")
        for part in ("scale", "normalized", "out")
    },
}
# TransformerLens's aliases for the same activations.
_ALIASES: dict[str, str] = {
    "attn": "pattern",
    "attn_logits": "attn_scores",
    "attn_weights": "pattern",
    "mlp_pre": "pre",
    "mlp_post": "post",
    "resid": "resid_post",
}
_GLOBAL: dict[str, str] = {
    "embed": "hook_embed",
    "pos_embed": "hook_pos_embed",
    "ln_final_scale": "ln_final.hook_scale",
    "ln_final_normalized": "ln_final.hook_normalized",
}
# Before and after each sublayer, and after each add (post-residual norms).
NORM_SITES: tuple[str, ...] = (
    "ln1", "ln2", "ln1_post", "ln2_post", "ln_resid_mid", "ln_resid_post",
)  # fmt: skip
_LAYER_RE = re.compile(r"^blocks\.(\d+)\.")


def short_names() -> list[str]:
    """Every short name that `get_act_name` expands, aliases included."""
    return sorted({*_TEMPLATES, *_ALIASES, *_GLOBAL})


def get_act_name(name: str, layer: int | None = None, layer_type: str | int | None = None) -> str:
    """Expand a short activation name to a full hook name (TransformerLens's `get_act_name`).

    `get_act_name("pattern", 0)` is `"blocks.0.attn.hook_pattern"`;
    `get_act_name("scale", 1, "ln2")` is `"blocks.1.ln2.hook_scale"`;
    `get_act_name("scale")` is the final norm's `"ln_final.hook_scale"`;
    `get_act_name("q_norm_out", 0)` is the query norm's `"blocks.0.attn.q_norm.hook_out"`;
    `get_act_name("expert_out", 0, 3)` is expert 3's `"blocks.0.mlp.experts.3.hook_out"`
    (the expert's index where a norm's name would go).
    A full name is returned unchanged. `layer` must already be non-negative here; the
    cache resolves negative layers because it knows how many there are.
    """
    if "." in name or name.startswith("hook_"):
        return name
    name = _ALIASES.get(name, name)
    if name in _GLOBAL:
        return _GLOBAL[name]
    if name not in _TEMPLATES:
        raise KeyError(f"unknown activation name {name!r}{_suggest(name, short_names())}")
    if layer is None:
        if name in ("scale", "normalized"):
            return f"ln_final.hook_{name}"
        raise ValueError(f"{name!r} lives in every block: give a layer, e.g. ({name!r}, 0)")
    if not isinstance(layer, int) or layer < 0:
        raise ValueError(f"layer must be a non-negative int here, got {layer!r}")
    template = _TEMPLATES[name]
    if template is _EXPERT:
        if not isinstance(layer_type, int) or isinstance(layer_type, bool) or layer_type < 0:
            raise ValueError(
                f"{name!r} of layer {layer} needs the expert's index: ({name!r}, {layer}, 0); "
                f"got {layer_type!r}"
            )
        part = name.removeprefix("expert_")
        return template.format(layer=layer, expert=layer_type, part=part)
    if template is _NORM:
        if layer_type not in NORM_SITES:
            raise ValueError(
                f"{name!r} of layer {layer} needs the norm: ({name!r}, {layer}, 'ln1') or "
                f"({name!r}, {layer}, 'ln2'); got layer_type={layer_type!r}"
            )
    elif layer_type is not None:
        raise ValueError(
            f"layer_type is only for 'scale' and 'normalized' (a norm) and the expert_* names "
            f"(an expert's index), not {name!r}"
        )
    if template is _QK_NORM:
        site, part = name.rsplit("_", 1)
        return template.format(layer=layer, site=site, part=part)
    if template is _SHARED:
        return template.format(layer=layer, part=name.removeprefix("shared_"))
    return template.format(layer=layer, name=name, layer_type=layer_type)


def expand_key(key: str | tuple, n_layers: int) -> str:
    """Expand a cache key (a full name or a shorthand tuple) to a full hook name.

    Negative layers count from the end, as in Python indexing: `("resid_pre", -1)` is the
    last block's `resid_pre`.
    """
    if isinstance(key, str):
        return get_act_name(key)
    if not isinstance(key, tuple) or not 1 <= len(key) <= 3 or not isinstance(key[0], str):
        raise KeyError(
            f"cache keys are a hook name or (name, layer[, 'ln1'|'ln2'|expert]), got {key!r}"
        )
    name, layer, layer_type = (*key, None, None)[:3]
    if layer is not None:
        if not isinstance(layer, int) or isinstance(layer, bool):
            raise KeyError(f"layer must be an int, got {layer!r} in key {key!r}")
        if not -n_layers <= layer < n_layers:
            raise KeyError(f"layer {layer} out of range for a model with {n_layers} layers")
        layer %= n_layers
    return get_act_name(name, layer, layer_type)


def head_label(layer: int, head: int) -> str:
    """`"L{layer}H{head}"`, the label of one attention head."""
    return f"L{layer}H{head}"


def layer_of(name: str) -> int | None:
    """The block index of a hook name, or None for names outside the blocks."""
    match = _LAYER_RE.match(name)
    return int(match.group(1)) if match else None


def pos_axis(name: str) -> int:
    """The position axis of the activation at `name` (with the batch axis first).

    Attention scores and patterns, and a mixer's mixing, are `[batch head query_pos
    key_pos]`: their position is the query position. Everything else is `[batch pos ...]`,
    except an expert's rows (`is_rows`), which have neither axis.
    """
    return 2 if name.endswith(("hook_attn_scores", "hook_pattern", "hook_mixing")) else 1


_ROWS_RE = re.compile(r"^blocks\.\d+\.mlp\.experts\.(\d+)\.hook_\w+$")


def is_rows(name: str) -> bool:
    """Whether the activation at `name` (or its gradient) is one expert's rows, `[row ...]`:
    one row per token routed to it, no batch or position axis (`blocks.0.mlp.experts.3.
    hook_out`)."""
    return bool(_ROWS_RE.match(name.removesuffix("_grad")))


def expert_of(name: str) -> int | None:
    """The expert whose rows the activation at `name` is (`is_rows`), or None."""
    match = _ROWS_RE.match(name.removesuffix("_grad"))
    return int(match.group(1)) if match else None


# The axes of each activation, batch first, in the glossary's names (hookedattn/core/__init__.py).
_AXES: dict[str, str] = {
    **{
        n: "batch pos d_model"
        for n in (
            "resid_pre",
            "resid_mid",
            "resid_post",
            "attn_out",
            "mlp_out",
            "mlp_in",
            "mixer_in",
        )
    },
    **{n: "batch pos d_model" for n in ("embed", "pos_embed", "normalized")},
    **{n: "batch pos head d_model" for n in ("attn_in", "q_input", "k_input", "v_input")},
    "result": "batch pos head d_model",
    **{
        n: "batch pos head d_head"
        for n in ("q", "k", "v", "z", "z_normed", "rot_q", "rot_k", "q_tuned")
    },
    "z_diff": "batch pos head d_head",  # its heads the pairs, its d_head two heads wide
    **{
        f"{s}_{p}": "batch pos head d_head"
        for s in ("q_norm", "k_norm", "v_norm")
        for p in ("normalized", "out")
    },
    **{n: "batch head query_pos key_pos" for n in ("attn_scores", "pattern")},
    # Latent attention (v and z are `d_head_v` wide there): its latents and shared key.
    **{n: "batch pos q_rank" for n in ("q_latent", "q_a_norm_normalized", "q_a_norm_out")},
    **{n: "batch pos kv_rank" for n in ("kv_latent", "kv_a_norm_normalized", "kv_a_norm_out")},
    "k_rope": "batch pos d_rope",
    "index_q": "batch pos index_head d_index",
    **{n: "batch pos d_index" for n in ("index_k", "index_k_norm_normalized", "index_k_norm_out")},
    "index_weights": "batch pos index_head",
    "index_scores": "batch query_pos key_pos",
    **{n: "batch pos d_mlp" for n in ("pre", "pre_linear", "mid", "post")},
    # The norm over the neurons of a `solu_ln` MLP (`blocks.0.mlp.ln.hook_normalized`).
    "mlp_ln_normalized": "batch pos d_mlp",
    "router_logits": "batch pos expert",
    **{n: "batch pos k" for n in ("expert_indices", "expert_weights")},
    "shared_out": "batch pos d_model",
    **{f"shared_{p}": "batch pos d_mlp_shared" for p in ("pre", "pre_linear", "post")},
    **{f"expert_{p}": "row d_model" for p in ("in", "out")},
    **{f"expert_{p}": "row d_mlp" for p in ("pre", "pre_linear", "post")},
}


def axis_names(name: str) -> tuple[str, ...]:
    """The axes of the activation (or its gradient) at the full hook name `name`, batch first.

    `axis_names("blocks.0.attn.hook_pattern")` is `("batch", "head", "query_pos", "key_pos")`.
    A norm reading a per-head input (`use_split_qkv_input`, `use_attn_in`) has a `head` axis
    after `pos` that this does not list; names without a fixed layout (`hook_scale`, a q/k
    norm's too) give `()`.
    """
    parts = name.removesuffix("_grad").split(".")
    short = parts[-1].removeprefix("hook_")
    if len(parts) > 1 and parts[-2] in ("q_norm", "k_norm", "v_norm", "q_a_norm", "kv_a_norm"):
        short = f"{parts[-2]}_{short}"
    if parts[-3:-1] == ["indexer", "k_norm"]:  # the indexer's one key per position
        short = f"index_k_norm_{parts[-1].removeprefix('hook_')}"
    if parts[-3:-1] == ["mlp", "ln"]:  # a solu_ln MLP's norm, over the neurons
        short = f"mlp_ln_{short}"
    if len(parts) > 1 and parts[-2] == "shared_expert":  # its own width, d_mlp_shared
        short = f"shared_{short}"
    if is_rows(name):
        short = f"expert_{short}"
    return tuple(_AXES.get(short, "").split())


def _suggest(name: str, valid: Iterable[str]) -> str:
    """A `; did you mean ...` hint with the valid names closest to `name`."""
    close = difflib.get_close_matches(name, list(valid), n=3, cutoff=0.4)
    return f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""


def unknown_name_message(name: str, valid: Iterable[str]) -> str:
    """The message for a hook name that does not exist, with the closest valid names."""
    valid = list(valid)
    hint = _suggest(name, valid)
    if not hint:
        hint = f"; valid names include {', '.join(repr(v) for v in valid[:6])}, ..."
    return f"no hook point named {name!r} in this model{hint}"
