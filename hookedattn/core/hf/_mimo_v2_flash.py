"""MiMo-V2-Flash (`MiMoV2FlashForCausalLM`): attention shaped per block.

Its full-attention and sliding-window blocks (`layer_types`) differ in their attention:

    key/value heads    `num_key_value_heads` in the full blocks, twice that in the sliding
                       ones (`n_key_value_heads_layers`); query heads, `head_dim` and
                       `v_head_dim` the same in both
    sinks              a learned logit per head in the sliding blocks only (GPT-OSS's,
                       `attn_sinks_layers`)
    window             `sliding_window` keys in the sliding blocks (`attn_types`)
    rotary             one `rope_parameters` per layer type: its own base in each
                       (`rotary_base_local` for the sliding blocks), the first
                       `int(head_dim * partial_rotary_factor)` dimensions turning (the same
                       share in both: a block of another share is refused by name)

and in both: values `v_head_dim` wide, narrower than the queries' and keys' `head_dim`
(`d_head_v`), multiplied by `attention_value_scale` (folded into `W_V`, `b_V`: the scale of a
linear map), scores scaled by `head_dim ** -0.5`, no bias on the output map. Its MLPs are
DeepSeek V3's (`_deepseek`): dense in the "dense" blocks of `mlp_layer_types`, elsewhere a
sigmoid router with a choice bias over SwiGLU experts, without shared experts. Layers a
checkpoint keeps past `num_hidden_layers` (its multi-token prediction module, `model.mtp.`)
are not read, as `transformers` does not read them; its files name the sinks
`attention_sink_bias`.
"""

from typing import Any

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _deepseek, _translate
from hookedattn.core.hf._family import Family, tied_unembedding
from hookedattn.core.hf._llama import L
from hookedattn.core.hf._table import Rule, Table, times, zeros

_PARTIAL = 0.334  # `partial_rotary_factor` where a layer type's parameters leave it out


def mimo_v2_flash_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `transformers.MiMoV2FlashConfig` (module docstring)."""
    c = hf_config
    ropes = {kind: _rope(c, kind) for kind in ("full_attention", "sliding_attention")}
    fields = _translate.llama_like(c, rope=ropes["full_attention"]) | _translate.rotary(
        c, c.head_dim, partial=True, rope=ropes["full_attention"]
    )
    sliding = tuple(t == "sliding_attention" for t in c.layer_types[: c.num_hidden_layers])
    if any(sliding):
        fields["rotary_base_local"] = float(ropes["sliding_attention"]["rope_theta"])
    kv = tuple(c.num_key_value_heads * (2 if s else 1) for s in sliding)
    router = {
        "router_scoring": "sigmoid",
        "norm_topk_prob": bool(c.norm_topk_prob),
        "n_expert_groups": c.n_group or 1,
        "topk_expert_groups": c.topk_group or 1,
    }
    return fields | _deepseek.feed_forward(c, router) | {
        "n_key_value_heads": kv[0],
        "n_key_value_heads_layers": kv if len(set(kv)) > 1 else None,
        "d_head_v": c.v_head_dim,
        "use_attn_sinks": any(sliding),
        "attn_sinks_layers": sliding if any(sliding) and not all(sliding) else None,
        "attn_scale": float(c.head_dim) ** 0.5,
    }  # fmt: skip


def _rope(c: Any, kind: str) -> dict[str, Any]:
    """The rotary parameters of the blocks of `kind`, with MiMo's default share; a
    ValueError names a scaled rotary, or a share unlike the other kind's."""
    ropes = c.rope_parameters
    rope = {"partial_rotary_factor": _PARTIAL, **ropes[kind]}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"the {kind} blocks' rope_type {rope['rope_type']!r} cannot be "
                         "imported for MiMo-V2-Flash: 'default'")  # fmt: skip
    shares = {k: {"partial_rotary_factor": _PARTIAL, **ropes[k]}["partial_rotary_factor"]
              for k in ropes}  # fmt: skip
    if len(set(shares.values())) > 1:
        raise ValueError(
            f"partial_rotary_factor per layer type {shares}: blocks rotating different "
            "shares of their heads are not imported (one rotary_dim for every block)"
        )
    return rope


def mimo_v2_flash_table(
    hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None
) -> Table:
    """MiMo-V2-Flash: each block's attention by its own shape, DeepSeek V3's MLPs."""
    bias = bool(getattr(hf_config, "attention_bias", False))
    scale = hf_config.attention_value_scale
    scaled = times(1.0 if scale is None else float(scale))
    moe = [i for i in range(cfg.n_layers) if cfg.layer_is_moe(i)]
    dense = [i for i in range(cfg.n_layers) if not cfg.layer_is_moe(i)]
    rules = [
        Rule("embed.W_E", "model.embed_tokens.weight", "d_vocab d_model -> d_vocab d_model"),
        *(r for layer in range(cfg.n_layers) for r in _attention(cfg, layer, bias, scaled)),
        *_deepseek.each_layer(_deepseek.dense_rules(cfg), dense),
        *_deepseek.each_layer(_deepseek.moe_rules(cfg, live=hf_model is not None), moe),
        Rule("ln_final.w", "model.norm.weight", "d_model -> d_model"),
        Rule("unembed.W_U", "lm_head.weight", "d_vocab_out d_model -> d_model d_vocab_out"),
        zeros("unembed.b_U", "d_vocab_out"),
    ]
    # The files keep each sink as `attention_sink_bias` (`transformers`' renaming on load).
    sinks = {
        f"{L}.self_attn.sinks".replace("{layer}", str(layer)): (
            f"{L}.self_attn.attention_sink_bias".replace("{layer}", str(layer)),
        )
        for layer in range(cfg.n_layers)
        if cfg.attention_config(layer).use_attn_sinks
    }
    beyond = rf"^model\.layers\.(?!({'|'.join(map(str, range(cfg.n_layers)))})\.)\d+\."
    return Table(
        rules=tuple(rules),
        aliases=tied_unembedding(hf_config, "model.embed_tokens.weight") | sinks,
        ignored=(r"rotary_emb\.", beyond, r"^model\.mtp\."),
        label="MiMo-V2-Flash",
        base_prefix="model.",
    )


def _attention(cfg: HookedTransformerConfig, layer: int, bias: bool, scaled: Any) -> list[Rule]:
    """Block `layer`'s norms and attention, by its own heads (`cfg.attention_config`):
    grouped keys and values where it has fewer key/value heads than query heads, sinks
    where it has them, the value scale folded into `W_V`, `b_V`."""
    own = cfg.attention_config(layer)
    kv, k_name, v_name = ("kv_head", "_W_K", "_W_V") if own.n_kv_heads != own.n_heads else (
        "head", "W_K", "W_V")  # fmt: skip
    b, a = f"blocks.{layer}", f"{L}.self_attn".replace("{layer}", str(layer))
    n = f"{L}".replace("{layer}", str(layer))

    def biased(ours: str, hf: str, axes: str, adjust: Any = None) -> Rule:
        return Rule(ours, hf, f"({axes}) -> {axes}", adjust=adjust) if bias else zeros(ours, axes)

    rules = [
        Rule(f"{b}.ln1.w", f"{n}.input_layernorm.weight", "d_model -> d_model"),
        Rule(f"{b}.attn.W_Q", f"{a}.q_proj.weight", "(head d_head) d_model -> head d_model d_head"),
        Rule(f"{b}.attn.{k_name}", f"{a}.k_proj.weight",
             f"({kv} d_head) d_model -> {kv} d_model d_head"),
        Rule(f"{b}.attn.{v_name}", f"{a}.v_proj.weight",
             f"({kv} d_head_v) d_model -> {kv} d_model d_head_v", adjust=scaled),
        Rule(f"{b}.attn.W_O", f"{a}.o_proj.weight",
             "d_model (head d_head_v) -> head d_head_v d_model"),
        biased(f"{b}.attn.b_Q", f"{a}.q_proj.bias", "head d_head"),
        biased(f"{b}.attn.{k_name.replace('W', 'b')}", f"{a}.k_proj.bias", f"{kv} d_head"),
        biased(f"{b}.attn.{v_name.replace('W', 'b')}", f"{a}.v_proj.bias", f"{kv} d_head_v",
               adjust=scaled),
        zeros(f"{b}.attn.b_O", "d_model"),
        Rule(f"{b}.ln2.w", f"{n}.post_attention_layernorm.weight", "d_model -> d_model"),
    ]  # fmt: skip
    if own.use_attn_sinks:
        rules.append(Rule(f"{b}.attn.sinks", f"{a}.sinks", "head -> head"))
    return rules


FAMILY = Family(
    "MiMoV2FlashForCausalLM", "mimo_v2_flash", mimo_v2_flash_fields, mimo_v2_flash_table
)
