"""HF config fields to ours: the parts several families share (activations, rotary
positions and their scaling, sliding windows, the Llama-like shape fields).

`transformers` 5 keeps the rotary parameters in `config.rope_parameters` (`rope_type`,
`rope_theta`, and per type `factor`...), the per-layer attention kinds in
`config.layer_types` ("full_attention" / "sliding_attention") and the head width in
`config.head_dim`, which may differ from `hidden_size / num_attention_heads`.
"""

import math
from typing import Any

# HF activation names to ours. `gelu_pytorch_tanh` is GPT-2's `gelu_new`: the same tanh
# approximation, which torch computes in one kernel.
ACT_FNS = {
    "gelu_new": "gelu_new",
    "gelu_pytorch_tanh": "gelu_new",
    "gelu": "gelu",
    "relu": "relu",
    "silu": "silu",
    "swish": "silu",
    "relu2": "relu2",
}
ROPE_TYPES = ("default", "linear", "llama3", "proportional")
_ATTN_TYPES = {"full_attention": "global", "sliding_attention": "local"}


def activation(name: str, field: str = "hidden_act") -> str:
    """Our `act_fn` for an HF activation name; one we do not compute is an error."""
    if name not in ACT_FNS:
        raise ValueError(f"{field} {name!r} cannot be imported; supported: {sorted(ACT_FNS)}")
    return ACT_FNS[name]


def rotary(
    hf_config: Any,
    d_head: int,
    partial: bool = False,
    yarn: bool = False,
    rope: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Rotary fields: base, rotated width (`partial_rotary_factor` where the family applies
    it, GPT-NeoX), and the "linear" or "llama3" frequency scaling; "yarn" too for the
    families whose YaRN is tested against HF's (`yarn`: GPT-OSS). `rope` is the parameters
    to read, when not the config's own `rope_parameters` (Gemma 3 keeps one per layer type).
    """
    rope = dict((getattr(hf_config, "rope_parameters", None) or {}) if rope is None else rope)
    rope_type = rope.get("rope_type", "default")
    supported = (*ROPE_TYPES, "yarn") if yarn else ROPE_TYPES
    if rope_type not in supported:
        raise ValueError(
            f"rope_type {rope_type!r} cannot be imported (its frequencies depend on the "
            f"sequence or need attention scaling); supported: {', '.join(supported)}"
        )
    factor = rope.get("partial_rotary_factor", 1.0) if partial else 1.0
    fields: dict[str, Any] = {
        "positional_embedding_type": "rotary",
        "rotary_base": float(rope["rope_theta"]),
        "rotary_dim": int(d_head * factor),  # HF truncates the same way
    }
    if rope_type == "linear":
        fields["rotary_scaling_factor"] = float(rope["factor"])
    if rope_type == "proportional":  # the whole head's pairs, the slowest still
        fields |= _proportional(rope, d_head)
    if rope_type == "llama3":
        fields |= {
            "use_NTK_by_parts_rope": True,
            "NTK_by_parts_factor": float(rope["factor"]),
            "NTK_by_parts_low_freq_factor": float(rope["low_freq_factor"]),
            "NTK_by_parts_high_freq_factor": float(rope["high_freq_factor"]),
            "NTK_original_ctx_len": int(rope["original_max_position_embeddings"]),
        }
    if rope_type == "yarn":
        fields |= _yarn(hf_config, rope)
    return fields


def _proportional(rope: dict[str, Any], d_head: int) -> dict[str, Any]:
    """ "proportional" RoPE's fields: the whole head's frequencies and pairing, of which the
    first `partial_rotary_factor` turn (as `transformers` reads it, from the parameters),
    the rest still; all slowed by `factor`."""
    pairs = int(rope.get("partial_rotary_factor", 1.0) * d_head // 2)
    return {
        "rotary_dim": d_head - d_head % 2,
        "rotary_pairs": pairs,
        "rotary_scaling_factor": float(rope.get("factor", 1.0)),
    }


def _yarn(hf_config: Any, rope: dict[str, Any]) -> dict[str, Any]:
    """YaRN's fields, with HF's defaults: the factor (else the ratio of the contexts), the
    band edges (32 and 1 rotations), truncated edges, and the attention factor (given, else
    `0.1 ln(factor) + 1`, or the ratio of two such with `mscale` and `mscale_all_dim`)."""
    original = int(rope["original_max_position_embeddings"])
    factor = rope.get("factor") or hf_config.max_position_embeddings / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = rope.get("attention_factor")
    if attention is None:
        m, m_all = rope.get("mscale"), rope.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    return {
        "use_yarn_rope": True,
        "yarn_factor": float(factor),
        "yarn_beta_fast": float(rope.get("beta_fast") or 32),
        "yarn_beta_slow": float(rope.get("beta_slow") or 1),
        "yarn_original_ctx_len": original,
        "yarn_truncate": bool(rope.get("truncate", True)),
        "rotary_attention_factor": float(attention),
    }


def window(hf_config: Any, mixed: frozenset[str] = frozenset()) -> dict[str, Any]:
    """`window_size` and per-layer `attn_types` from `sliding_window` and `layer_types`
    (GPT-Neo's: `window_size` and `attention_layers`); in a hybrid, the `layer_types` values
    `mixed` are its mixers' layers (`_mixers`), which attend nowhere: "global" here.

    A config with a window and no `layer_types` (Mistral) slides it in every layer; Qwen's
    `sliding_window` is already None unless `use_sliding_window`.
    """
    size = getattr(hf_config, "sliding_window", None)
    if size is None and getattr(hf_config, "attention_layers", None):  # GPT-Neo's
        types = tuple(_ATTN_TYPES.get(kind, kind) for kind in hf_config.attention_layers)
        unknown = sorted(set(types) - {"global", "local"})
        if unknown:
            raise ValueError(f"attention_layers {unknown} cannot be imported: global, local")
        if "local" not in types:
            return {}
        return {"window_size": int(hf_config.window_size), "attn_types": types}
    if size is None:
        return {}
    layer_types = getattr(hf_config, "layer_types", None)
    if layer_types is None:
        return {"window_size": int(size)}
    unknown = sorted(set(layer_types) - set(_ATTN_TYPES) - mixed)
    if unknown:
        raise ValueError(
            f"layer_types {unknown} cannot be imported; supported: {sorted(_ATTN_TYPES)}"
        )
    types = tuple(_ATTN_TYPES.get(kind, "global") for kind in layer_types)
    if "local" not in types:
        return {}
    return {"window_size": int(size), "attn_types": types}


def llama_like(
    hf_config: Any,
    act_field: str = "hidden_act",
    yarn: bool = False,
    rope: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The fields every Llama-descended config spells the same way: shape, grouped keys and
    values, RMSNorm, a gated MLP, full-width rotary positions (YaRN's too, if `yarn`; from
    `rope` when given, see `rotary`), the window."""
    c = hf_config
    n_heads = c.num_attention_heads
    d_head = getattr(c, "head_dim", None) or c.hidden_size // n_heads
    n_kv = getattr(c, "num_key_value_heads", None) or n_heads
    return {
        "n_layers": c.num_hidden_layers,
        "d_model": c.hidden_size,
        "n_ctx": c.max_position_embeddings,
        "d_vocab": c.vocab_size,
        "n_heads": n_heads,
        "d_head": d_head,
        "d_mlp": c.intermediate_size,
        # Without grouping the keys and values are stored per query head, as in GPT-2.
        "n_key_value_heads": None if n_kv == n_heads else n_kv,
        "act_fn": activation(getattr(c, act_field), act_field),
        "gated_mlp": True,
        "normalization_type": "RMS",
        "eps": c.rms_norm_eps,
        "attn_scale": d_head**0.5,
        **rotary(c, d_head, yarn=yarn, rope=rope),
        **window(c),
    }
