"""Gemma 4, text (`Gemma4ForCausalLM`, "gemma4_text"; `Gemma4UnifiedForCausalLM`,
"gemma4_unified_text"; their multimodal `...ForConditionalGeneration` imported as these,
`_composite`).

Gemma 3's block (norms before and after each sublayer, GeGLU, per-head q/k RMSNorms, local
and global layers by `layer_types`, each with a rotary of its own, the embedding times
`sqrt(d_model)`), with these changes, each read from the config:

    norms         every RMSNorm multiplies by its gain `w` itself (not Gemma 3's `1 + w`)
    attention     shaped per block by `per_layer_config` (the global blocks' heads
                  `head_dim` wide, twice the local ones'; on some sizes fewer key/value
                  heads): `d_head_layers`, `n_key_value_heads_layers`; scores not scaled
                  (`attn_scale` 1: the q/k norms set their size); each value head RMS-normed
                  without a gain (`use_v_norm`); on the larger sizes the global blocks'
                  keys serve as their values (`attention_k_eq_v`: `W_V` read from
                  `k_proj`, the values the keys before their norm and rotation)
    rotary        the global blocks by their `rope_parameters` entry ("proportional": the
                  first `partial_rotary_factor` of the whole head's pairs turn), the local
                  blocks by theirs over their own narrower heads (`rotary_base_local`,
                  `rotary_dim_local`)
    layer scalar  each block's output stream times its `layer_scalar` (`resid_post_scale`)
    per-layer     the small sizes' (`hidden_size_per_layer_input`): every block's own input
    inputs        from a table of the tokens and a projection of their embedding, read by a
                  third sublayer after the MLP (`d_per_layer_input`,
                  `components.per_layer_input`; HF's constants folded into the weights)
    shared keys   the small sizes' (`num_kv_shared_layers`): the last blocks compute queries
                  alone and read the keys and values of the last earlier block of their
                  attention type (`n_kv_shared_layers`, `components.shared_kv_attention`;
                  their `k_proj`, `v_proj`, `k_norm` are not read); with
                  `use_double_wide_mlp` their MLPs twice as wide (`d_mlp_kv_shared`)
    experts       the 26B-A4B's (`enable_moe_block`, where the config declares it): a
                  mixture beside each block's dense MLP (`moe_beside_mlp`), each behind
                  norms of its own, the router reading the stream through a norm of its own
                  (its `scale` times `d_model ** -0.5`), each chosen expert's weight times
                  its `per_expert_scale` (`router_expert_scale`)

What this does not import is refused by name, before any weight is read: every layer
reusing another model's keys and values (`num_kv_shared_layers == num_hidden_layers`, the
assistant models'), bidirectional attention over all tokens
(`use_bidirectional_attention="all"`; "vision", the unified models' default, attends
causally over text alone), and a `per_layer_config` setting anything but `head_dim` and
`num_key_value_heads`.
"""

from typing import Any

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _gemma, _translate
from hookedattn.core.hf._family import Family, tied_unembedding
from hookedattn.core.hf._llama import L
from hookedattn.core.hf._table import Rule, Table, times, zeros

_PER_LAYER_READ = {"head_dim", "num_key_value_heads"}


def gemma4_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `transformers.Gemma4TextConfig` or
    `Gemma4UnifiedTextConfig` (module docstring)."""
    c = hf_config
    _refuse_unimported(c)
    own = [c.per_layer_config[layer] for layer in range(c.num_hidden_layers)]
    d_heads = tuple(o.head_dim for o in own)
    kv = tuple(o.num_key_value_heads for o in own)
    wide = c.per_layer_config["full_attention"]
    n_kv = wide.num_key_value_heads
    fields = {
        "n_layers": c.num_hidden_layers,
        "d_model": c.hidden_size,
        "n_ctx": c.max_position_embeddings,
        "d_vocab": c.vocab_size,
        "n_heads": c.num_attention_heads,
        "d_head": wide.head_dim,  # the widest: the global blocks' rotary fits it
        "d_head_layers": d_heads if len(set(d_heads)) > 1 else None,
        "n_key_value_heads": None if n_kv == c.num_attention_heads else n_kv,
        "n_key_value_heads_layers": kv if len(set(kv)) > 1 else None,
        "d_mlp": c.intermediate_size,
        "act_fn": _translate.activation(c.hidden_activation, "hidden_activation"),
        "gated_mlp": True,
        "normalization_type": "RMS",
        "normalization_placement": "pre_and_post",
        "eps": c.rms_norm_eps,
        "attn_scale": 1.0,
        "use_qk_norm": True,
        "qk_norm_per_head": True,
        "use_v_norm": True,
        "resid_post_scale": True,
        "output_logits_soft_cap": c.final_logit_softcapping,
    }
    fields |= _kv_sharing(c) | _experts(c)
    if getattr(c, "hidden_size_per_layer_input", None):  # the small sizes
        fields["d_per_layer_input"] = c.hidden_size_per_layer_input
        fields["d_vocab_per_layer_input"] = c.vocab_size_per_layer_input
    fields |= _translate.rotary(c, wide.head_dim, partial=True,
                                rope=c.rope_parameters["full_attention"])  # fmt: skip
    fields |= _translate.window(c)
    if "local" in (fields.get("attn_types") or ()):
        narrow = c.per_layer_config["sliding_attention"].head_dim
        local = _gemma.local_rotary(c.rope_parameters["sliding_attention"])
        fields |= local | {"rotary_dim_local": narrow - narrow % 2}
    return fields


def _kv_sharing(c: Any) -> dict[str, Any]:
    """The last layers reading earlier layers' keys and values, and their MLPs' width
    (`use_double_wide_mlp`: twice `intermediate_size`, in those layers only)."""
    n = getattr(c, "num_kv_shared_layers", 0) or 0
    if not n:
        return {}
    wide = 2 * c.intermediate_size if getattr(c, "use_double_wide_mlp", False) else None
    return {"n_kv_shared_layers": n, "d_mlp_kv_shared": wide}


def _experts(c: Any) -> dict[str, Any]:
    """The mixture of experts beside each block's dense MLP (`enable_moe_block`): experts
    `moe_intermediate_size` wide, the dense MLP `intermediate_size`; the router's softmax
    over every expert, the chosen renormalised, times each expert's own scale. Read where
    the config declares the field (the unified models' do not, and build no mixture)."""
    if not hasattr(type(c), "enable_moe_block") or not c.enable_moe_block:
        return {}
    return {
        "moe_beside_mlp": True,
        "num_experts": c.num_experts,
        "experts_per_token": c.top_k_experts,
        "norm_topk_prob": True,
        "router_expert_scale": True,
        "d_mlp": c.moe_intermediate_size,
        "d_mlp_dense": c.intermediate_size,
    }


def _refuse_unimported(c: Any) -> None:
    """A ValueError naming every piece the config switches on that is not imported."""
    said = []
    if (getattr(c, "num_kv_shared_layers", 0) or 0) >= c.num_hidden_layers:
        said.append(f"every layer reusing another model's keys and values "
                    f"(num_kv_shared_layers={c.num_kv_shared_layers})")  # fmt: skip
    if getattr(c, "use_bidirectional_attention", None) == "all":
        said.append("bidirectional attention (use_bidirectional_attention='all')")
    per_layer = c.to_dict().get("per_layer_config") or {}
    other = sorted({k for setting in per_layer.values() for k in setting} - _PER_LAYER_READ)
    if other:
        said.append(f"per_layer_config setting {other} (read: {sorted(_PER_LAYER_READ)})")
    if said:
        raise ValueError(f"Gemma 4's {'; '.join(said)} cannot be imported")


def gemma4_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """Gemma 4: each block's attention by its own shape, its norms' gains as they are, the
    value norms without gains, each block's scalar; `W_E` times `sqrt(d_model)`."""
    bias = bool(getattr(hf_config, "attention_bias", False))
    normaliser = _gemma.embedding_normaliser(hf_config, cfg.dtype, hf_model)
    b, gain = "blocks.{layer}", "d_model -> d_model"
    every_block = [
        Rule(f"{b}.ln2.w", f"{L}.pre_feedforward_layernorm.weight", gain),
        Rule(f"{b}.ln2_post.w", f"{L}.post_feedforward_layernorm.weight", gain),
        Rule(f"{b}.resid_scale.w", f"{L}.layer_scalar", "one -> one"),
    ]
    rules = [
        Rule("embed.W_E", "model.embed_tokens.weight", "d_vocab d_model -> d_vocab d_model",
             adjust=_gemma.scaled(normaliser)),
        *(r for layer in range(cfg.n_layers) for r in _attention(hf_config, cfg, layer, bias)),
        *(r for layer in range(cfg.n_layers) for r in _feed_forward(cfg, layer)),
        *(r for rule in every_block for r in rule.expand(cfg.n_layers)),
        Rule("ln_final.w", "model.norm.weight", gain),
        Rule("unembed.W_U", "lm_head.weight", "d_vocab_out d_model -> d_model d_vocab_out"),
        zeros("unembed.b_U", "d_vocab_out"),
    ]  # fmt: skip
    if cfg.d_per_layer_input is not None:
        rules += _per_layer_input_rules(hf_config, cfg, hf_model)
    return Table(
        rules=tuple(rules),
        aliases=tied_unembedding(hf_config, "model.embed_tokens.weight"),
        ignored=(r"rotary_emb\.", *_unread_keys(cfg)),
        label="Gemma 4",
        base_prefix="model.",
    )


def _feed_forward(cfg: HookedTransformerConfig, layer: int) -> list[Rule]:
    """Block `layer`'s gated MLP, `d_mlp` wide, or `d_mlp_kv_shared` in a block reading an
    earlier block's keys and values where that is set (`use_double_wide_mlp`); with the
    mixture beside it (`moe_beside_mlp`), `d_mlp_dense` wide, and the mixture."""
    wide = cfg.d_mlp_kv_shared is not None and cfg.kv_source_layer(layer) is not None
    d_mlp = "d_mlp_kv_shared" if wide else "d_mlp_dense" if cfg.moe_beside_mlp else "d_mlp"
    ours = "mlp_dense" if cfg.moe_beside_mlp else "mlp"
    b, n = f"blocks.{layer}", L.replace("{layer}", str(layer))
    into, out_of = f"{d_mlp} d_model -> d_model {d_mlp}", f"d_model {d_mlp} -> {d_mlp} d_model"
    dense = [
        Rule(f"{b}.{ours}.W_gate", f"{n}.mlp.gate_proj.weight", into),
        Rule(f"{b}.{ours}.W_in", f"{n}.mlp.up_proj.weight", into),
        Rule(f"{b}.{ours}.W_out", f"{n}.mlp.down_proj.weight", out_of),
        zeros(f"{b}.{ours}.b_in", d_mlp),
        zeros(f"{b}.{ours}.b_out", "d_model"),
    ]
    return dense + (_mixture(cfg, b, n) if cfg.moe_beside_mlp else [])


def _mixture(cfg: HookedTransformerConfig, b: str, n: str) -> list[Rule]:
    """Block `b`'s mixture beside its dense MLP (`moe_beside_mlp`): the router's norm
    (its gain `scale` times `d_model ** -0.5`, `transformers`' constant folded in), map and
    experts' scales; the experts (`gate_up_proj` the gate's half, then the up map's); the
    norms around the dense MLP's output and the mixture."""
    gate_up = "expert (gate_up d_mlp) d_model -> gate_up expert d_model d_mlp"
    down = "expert d_model d_mlp -> expert d_mlp d_model"
    gain, m = "d_model -> d_model", f"{b}.mlp"
    return [
        Rule(f"{b}.ln_router.w", f"{n}.router.scale", gain, adjust=times(cfg.d_model**-0.5)),
        Rule(f"{m}.W_router", f"{n}.router.proj.weight", "expert d_model -> d_model expert"),
        zeros(f"{m}.b_router", "expert"),
        Rule(f"{m}.w_expert_scale", f"{n}.router.per_expert_scale", "expert -> expert"),
        Rule(f"{m}.W_gate", f"{n}.experts.gate_up_proj", gate_up, pick=0),
        Rule(f"{m}.W_in", f"{n}.experts.gate_up_proj", gate_up, pick=1),
        Rule(f"{m}.W_out", f"{n}.experts.down_proj", down),
        *(zeros(f"{m}.{name}", "expert d_mlp") for name in ("b_gate", "b_in")),
        zeros(f"{m}.b_out", "expert d_model"),
        Rule(f"{b}.ln2_dense_post.w", f"{n}.post_feedforward_layernorm_1.weight", gain),
        Rule(f"{b}.ln2_moe.w", f"{n}.pre_feedforward_layernorm_2.weight", gain),
        Rule(f"{b}.ln2_moe_post.w", f"{n}.post_feedforward_layernorm_2.weight", gain),
    ]  # fmt: skip


def _unread_keys(cfg: HookedTransformerConfig) -> tuple[str, ...]:
    """The keys' and values' weights a checkpoint may hold for the layers reading an
    earlier layer's (`transformers` ignores them on load too)."""
    shared = [layer for layer in range(cfg.n_layers) if cfg.kv_source_layer(layer) is not None]
    return tuple(rf"layers\.{layer}\.self_attn\.(k_proj|v_proj|k_norm|v_norm)\."
                 for layer in shared)  # fmt: skip


def _per_layer_input_rules(
    hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None
) -> list[Rule]:
    """The per-layer inputs' table, projection and norm, and each block's sublayer reading
    them; `transformers`' constants folded in (`components.per_layer_input`): the table's
    `sqrt(d_ple)` (rounded to the weights' dtype, as HF rounds it) and the sum's
    `2 ** -0.5` into `W_E` and the norm's gain, the projection's `d_model ** -0.5` into
    `W_proj`."""
    module = None if hf_model is None else hf_model.model.embed_tokens_per_layer
    table_scale = _gemma.embedding_normaliser(
        hf_config, cfg.dtype, None, width=cfg.d_per_layer_input, module=module
    )
    half = 2.0**-0.5
    p, b = "per_layer_inputs", "blocks.{layer}.per_layer_input"
    every_block = [
        Rule(f"{b}.W_gate", f"{L}.per_layer_input_gate.weight", "d_ple d_model -> d_model d_ple"),
        Rule(f"{b}.W_out", f"{L}.per_layer_projection.weight", "d_model d_ple -> d_ple d_model"),
        Rule(f"{b}.ln_post.w", f"{L}.post_per_layer_input_norm.weight", "d_model -> d_model"),
    ]
    return [
        Rule(f"{p}.W_E", "model.embed_tokens_per_layer.weight",
             "d_vocab_ple (layer d_ple) -> d_vocab_ple layer d_ple",
             adjust=lambda W: W * table_scale.to(W.device) * half),
        Rule(f"{p}.W_proj", "model.per_layer_model_projection.weight",
             "(layer d_ple) d_model -> d_model layer d_ple",
             adjust=times(cfg.d_model**-0.5)),
        Rule(f"{p}.ln.w", "model.per_layer_projection_norm.weight", "d_ple -> d_ple",
             adjust=times(half)),
        *(r for rule in every_block for r in rule.expand(cfg.n_layers)),
    ]  # fmt: skip


def _attention(hf_config: Any, cfg: HookedTransformerConfig, layer: int, bias: bool) -> list[Rule]:
    """Block `layer`'s attention by its own heads (`cfg.attention_config`), its q/k norms'
    gains and the norms around it (a block reading an earlier block's keys and values: its
    queries' alone). A global block of a model whose keys serve as values
    (`attention_k_eq_v`: it has no `v_proj`) reads its values by its keys' map, `W_V = W_K`
    (the keys before their norm and rotation, as `transformers` takes them)."""
    own = cfg.attention_config(layer)
    keys_as_values = bool(getattr(hf_config, "attention_k_eq_v", False))
    v = "k" if keys_as_values and cfg.layer_attn_type(layer) == "global" else "v"
    kv, k_name, v_name = ("kv_head", "_W_K", "_W_V") if own.n_kv_heads != own.n_heads else (
        "head", "W_K", "W_V")  # fmt: skip
    b, n = f"blocks.{layer}", L.replace("{layer}", str(layer))
    a = f"{n}.self_attn"

    def biased(ours: str, hf: str, axes: str) -> Rule:
        return Rule(ours, hf, f"({axes}) -> {axes}") if bias else zeros(ours, axes)

    rules = [
        Rule(f"{b}.ln1.w", f"{n}.input_layernorm.weight", "d_model -> d_model"),
        Rule(f"{b}.attn.W_Q", f"{a}.q_proj.weight", "(head d_head) d_model -> head d_model d_head"),
        Rule(f"{b}.attn.{k_name}", f"{a}.k_proj.weight",
             f"({kv} d_head) d_model -> {kv} d_model d_head"),
        Rule(f"{b}.attn.{v_name}", f"{a}.{v}_proj.weight",
             f"({kv} d_head) d_model -> {kv} d_model d_head"),
        Rule(f"{b}.attn.W_O", f"{a}.o_proj.weight", "d_model (head d_head) -> head d_head d_model"),
        biased(f"{b}.attn.b_Q", f"{a}.q_proj.bias", "head d_head"),
        biased(f"{b}.attn.{k_name.replace('W', 'b')}", f"{a}.k_proj.bias", f"{kv} d_head"),
        biased(f"{b}.attn.{v_name.replace('W', 'b')}", f"{a}.{v}_proj.bias", f"{kv} d_head"),
        biased(f"{b}.attn.b_O", f"{a}.o_proj.bias", "d_model"),
        Rule(f"{b}.attn.q_norm.w", f"{a}.q_norm.weight", "d_head -> d_head"),
        Rule(f"{b}.attn.k_norm.w", f"{a}.k_norm.weight", "d_head -> d_head"),
        Rule(f"{b}.ln1_post.w", f"{n}.post_attention_layernorm.weight", "d_model -> d_model"),
    ]  # fmt: skip
    if cfg.kv_source_layer(layer) is None:
        return rules
    # A layer reading an earlier layer's keys and values has none of its own.
    own = {f"{b}.attn.{name}" for name in (k_name, v_name, "k_norm.w")}
    own |= {f"{b}.attn.{name.replace('W', 'b')}" for name in (k_name, v_name)}
    return [rule for rule in rules if rule.ours not in own]


FAMILY = Family("Gemma4ForCausalLM", "gemma4_text", gemma4_fields, gemma4_table)
UNIFIED = Family("Gemma4UnifiedForCausalLM", "gemma4_unified_text", gemma4_fields, gemma4_table)
