"""Our config's fields read off a checkpoint's config, for the importer by convention
(`_convention`): the rotary fields (`_translate`'s, and which layers rotate), an
encoder-decoder's decoder fields under the names every decoder spells, an attention-free
model's fields, the key/value heads, the MLP's width and the head width, and the settings
refused by name (soft-capped router logits, clamped queries, keys and values, blocks with
different head counts).
"""

import functools
from typing import Any

from hookedattn.core.hf import _handed_rotary, _translate
from hookedattn.core.hf._recognised import Anatomy

NORM_TYPES = {"rms": "RMS", "rms_one_plus": "RMS", "rms_bare": "RMS", "layer": "LN",
               "layer_one_plus": "LN", "layer_bare": "LN"}  # fmt: skip


def rotary_fields(hf_config: Any, anatomy: Anatomy, d_head: int) -> dict[str, Any]:
    """The rotary fields: `_translate.rotary`'s (one `rope_parameters` per layer type, as
    Gemma 3 and OLMo 3 keep them, give the local layers a base of their own), and which
    layers rotate (`no_rope_layers`, SmolLM 3's; or the anatomy's `rotary_on`)."""
    c = hf_config
    rope = dict(getattr(c, "rope_parameters", None) or {})
    by_type = {k: v for k, v in rope.items() if k in ("full_attention", "sliding_attention")}
    if by_type:
        rope = dict(by_type.get("full_attention") or by_type["sliding_attention"])
    if "rope_theta" not in rope:
        # CodeGen keeps none: its modeling code rotates by 10000's. Another fixed base would
        # fail the twin's verification.
        rope["rope_theta"] = getattr(c, "rope_theta", None) or 10000.0
    if getattr(c, "partial_rotary_factor", None) is not None:
        rope.setdefault("partial_rotary_factor", c.partial_rotary_factor)
    fields = _translate.rotary(c, d_head, partial=True, yarn=True, rope=rope)
    if isinstance(getattr(c, "rotary_dim", None), int):  # GPT-J's and CodeGen's: dims, not a share
        fields["rotary_dim"] = c.rotary_dim
    # GPT-J's and CodeGen's cosines and sines are a float32 table built once (their
    # `embed_positions`), RoFormer's a table handed to every layer: float32 in every dtype.
    table = isinstance(getattr(c, "rotary_dim", None), int) or anatomy.rotary_table is not None
    fields["rotary_table_float32"] = table
    # RoFormer's table is computed in float64 (numpy) and rounded to float32.
    fields["rotary_angles_float64"] = anatomy.rotary_table is not None
    local = by_type.get("sliding_attention")
    if local and local != by_type.get("full_attention", local):
        if local.get("rope_type", "default") != "default":
            raise ValueError(f"the sliding layers' rope_type {local['rope_type']!r}: only "
                             "'default' is imported by convention")  # fmt: skip
        fields["rotary_base_local"] = float(local["rope_theta"])
    layer_types = getattr(c, "layer_types", None) or ()
    if getattr(c, "no_rope_layers", None) is not None:
        fields["rotary_layers"] = tuple(bool(f) for f in c.no_rope_layers)
    elif anatomy.rotary_on == "sliding":
        fields["rotary_layers"] = tuple(t == "sliding_attention" for t in layer_types)
    return fields


_DECODER_FIELDS = {"num_hidden_layers": "decoder_layers", "num_attention_heads":
                   "decoder_attention_heads", "intermediate_size": "decoder_ffn_dim",
                   "max_position_embeddings": "max_target_positions",
                   "vocab_size": "decoder_vocab_size"}  # fmt: skip


class Decoder:
    """A config read as a decoder's: an encoder-decoder config's `decoder_*` fields (its
    causal LM is its decoder) in place of the ones `transformers` maps to the encoder's."""

    def __init__(self, hf_config: Any) -> None:
        self._config = hf_config

    def __getattr__(self, name: str) -> Any:
        own = _DECODER_FIELDS.get(name)
        if own is not None and getattr(self._config, own, None) is not None:
            return getattr(self._config, own)
        return getattr(self._config, name)


LOGIT_CAP_NAMES = ("final_logit_softcapping", "logits_soft_cap")  # RecurrentGemma's, second


def logit_cap(hf_config: Any) -> float | None:
    """The soft cap on the final logits, `cap * tanh(logits / cap)`, under either name a
    config gives it; None where the logits are not capped."""
    caps = (getattr(hf_config, name, None) for name in LOGIT_CAP_NAMES)
    return next((float(cap) for cap in caps if cap is not None), None)


def scores_cap(c: Any, a: Anatomy) -> float | None:
    """The soft cap of the attention scores: the config's `attn_logit_softcapping` where
    the candidate applies it (HF's Gemma 3 keeps the field and never applies it)."""
    return getattr(c, "attn_logit_softcapping", None) if a.attn_soft_cap else None


def attention_free_fields(c: Any, a: Anatomy) -> dict[str, Any]:
    """An attention-free model's fields (every layer `x + mixer(norm(x))`): no MLPs, no
    positions; one nominal head as wide as the stream, never built (no layer attends)."""
    return {
        "n_layers": c.num_hidden_layers,
        "d_model": c.hidden_size,
        "n_ctx": getattr(c, "max_position_embeddings", None) or 2048,
        "d_vocab": c.vocab_size,
        "n_heads": 1,
        "d_head": c.hidden_size,
        "attn_only": True,
        "normalization_type": NORM_TYPES[a.norm_kind],
        "eps": a.eps,
        "positional_embedding_type": "none",
        "mixers": a.mixers.config(c),
    }


def key_value_heads(c: Any) -> int:
    """Key/value heads: `num_key_value_heads` (Falcon's `num_kv_heads` in its new decoder
    layout), or one where `multi_query` (GPT-BigCode's, Falcon's first layout)."""
    if getattr(c, "new_decoder_architecture", False):
        return c.num_kv_heads
    if getattr(c, "multi_query", False):
        return 1
    if not declares(c, "num_key_value_heads"):  # passed to a config that never reads it
        return c.num_attention_heads
    return getattr(c, "num_key_value_heads", None) or c.num_attention_heads


def declares(c: Any, field: str) -> bool:
    """Whether `c`'s config class has `field` of its own (a default instance holds it, or
    its attribute map names it): `transformers` keeps any other keyword a config is given
    as an attribute that its model never reads (GPT-J's config given `num_key_value_heads`)."""
    config = c._config if isinstance(c, Decoder) else c
    return _declares(type(config), field)


@functools.cache
def _declares(config_class: type, field: str) -> bool:
    try:
        default = config_class()
    except Exception:  # a class that cannot be built without arguments: the field is read
        return True
    return hasattr(default, field)


def refuse_unimported(c: Any, hf_config: Any) -> None:
    """A ValueError where the config asks for what is not imported: a router's soft-capped
    logits, clamped queries, keys and values (`_refuse_clipped_qkv`), rotated values
    (`_handed_rotary`), or blocks with different head counts."""
    if (getattr(c, "moe_router_logit_softcapping", None) or 0.0) > 0.0:
        raise ValueError(
            f"moe_router_logit_softcapping={c.moe_router_logit_softcapping}: a router "
            "whose logits are soft-capped is not imported"
        )
    _refuse_clipped_qkv(hf_config)
    _refuse_clipped_swiglu(hf_config)
    _handed_rotary.refuse_rotated_values(hf_config)
    per_layer = set(getattr(c, "num_attention_heads_per_layer", None) or ())
    if per_layer - {c.num_attention_heads}:
        raise ValueError(
            f"num_attention_heads_per_layer={c.num_attention_heads_per_layer}: blocks with "
            f"different head counts are not imported (every block has n_heads)"
        )


def _refuse_clipped_swiglu(hf_config: Any) -> None:
    """A ValueError where experts or shared experts clip their SwiGLU per layer
    (`swiglu_limits`, `swiglu_limits_shared`: Bailing Hybrid's, Step 3.7's; 0 is no clip):
    a tiny twin's random weights never reach the clip, so its verification could not tell
    it is missing."""
    for field in ("swiglu_limits", "swiglu_limits_shared"):
        limits = list(getattr(hf_config, field, None) or ())
        if any(limits):
            raise ValueError(
                f"{field}={limits}: experts whose SwiGLU is clipped per layer are not "
                "imported (a limit of 0 is no clip, the only one imported)"
            )


def _refuse_clipped_qkv(hf_config: Any) -> None:
    """A ValueError where queries, keys and values are clamped (`clip_qkv`: OLMo's, MPT's in
    its `attn_config`): a tiny twin's random weights never reach the clamp, so its
    verification could not tell the clamp is missing."""
    for owner in (hf_config, getattr(hf_config, "attn_config", None) or {}):
        clip = (
            owner.get("clip_qkv") if isinstance(owner, dict) else getattr(owner, "clip_qkv", None)
        )
        if clip is not None:
            raise ValueError(f"clip_qkv={clip}: queries, keys and values clamped are not imported")


def mlp_width(c: Any) -> int:
    """The MLP's width: `intermediate_size` or the names other configs give it (4 d_model
    where a config leaves it None, as GPT-2-like ones do, or names none)."""
    if getattr(c, "block_auto_adjust_ff_dim", False):  # LFM2: 2/3 of it, scaled, rounded up
        width = int(2 * c.intermediate_size / 3)
        if getattr(c, "block_ffn_dim_multiplier", None) is not None:
            width, multiple = int(c.block_ffn_dim_multiplier * width), c.block_multiple_of
            width = multiple * ((width + multiple - 1) // multiple)
        return width
    if getattr(c, "model_type", None) == "recurrent_gemma":  # its MLP builds half of it
        return c.intermediate_size // 2
    for name in ("intermediate_size", "n_inner", "ffn_dim", "d_ff", "ffn_hidden_size", "dff"):
        if hasattr(c, name):
            width = getattr(c, name)
            return int(width) if width is not None else 4 * c.hidden_size
    if hasattr(c, "intermediate_multiple_size"):  # GPT-NeoX Japanese: a multiple of d_model
        return int(c.intermediate_multiple_size * c.hidden_size)
    # BLOOM and MPT name none: their modeling code builds 4 d_model. Another hard-coded width
    # would fail the twin's verification, and a checkpoint's tensors the table's shapes.
    return 4 * c.hidden_size


def head_width(hf_config: Any) -> int:
    """A config's head width: `head_dim` where it sets one, else `hidden_size / heads`."""
    c = hf_config
    return int(getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads)
