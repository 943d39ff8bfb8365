"""Nemotron-H (`NemotronHForCausalLM`): every layer is `x + mixer(norm(x))` with one sublayer,
a Mamba-2 mixer, an attention or an MLP, as `layers_block_type` (its
`hybrid_override_pattern`, "M*-") says. HF layer `L` is our block `L`, a block of one
sublayer (`MixerConfig.layers` and `mlp_layers`):

    "linear_attention"  a Mamba-2 mixer in attention's place, no MLP (`AttnOnlyBlock`:
                        `ln1`, `mixer`, `hook_attn_out`)
    "full_attention"    attention without positions (no rotary, no learned table), no MLP
                        (`AttnOnlyBlock`: `ln1`, `attn`, `hook_attn_out`)
    "mlp"               no mixing sublayer ("none"): `MLPOnlyBlock` (`ln2`, `mlp`: up,
                        `relu2`, down; `hook_mlp_out`)
    "moe"               as "mlp", the MLP a mixture of experts (`moe_layers`; `MoE`, plain
                        experts: `gated_mlp=False`): DeepSeek V3's sigmoid router over
                        groups (`gate.weight`, its choice bias `gate.e_score_correction_bias`),
                        experts `d_mlp` (`moe_intermediate_size`) wide, a shared expert
                        (`shared_experts`) `d_mlp_shared` wide; the "mlp" layers beside them
                        are `d_mlp_dense` (`intermediate_size`) wide

The layer's one norm is our `ln1` or `ln2`, by the sublayer it feeds. Written out, not
derived by convention: the convention reads a layer of attention and an MLP, and here each
layer's one child, `mixer`, is any of the four. The experts' optional latent projection
(`moe_latent_size`, off in the default config) is refused by name.
"""

from typing import Any

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _translate
from hookedattn.core.hf._family import Family, tied_unembedding
from hookedattn.core.hf._mixers import _mamba2_rules
from hookedattn.core.hf._moe import routing
from hookedattn.core.hf._table import MLP_IN, MLP_OUT, Rule, Table, zeros
from hookedattn.core.mixer_config import MixerConfig

# `layers_block_type`'s values -> our `MixerConfig.layers` kinds.
_KINDS = {"linear_attention": "mamba2", "full_attention": "attention", "mlp": "none",
          "moe": "none"}  # fmt: skip
_AT = "model.layers.{layer}"


def _kinds(c: Any) -> tuple[str, ...]:
    """Our kind of each layer; a layer kind we do not compute is a ValueError naming it."""
    unknown = sorted({t for t in c.layers_block_type if t not in _KINDS})
    if unknown:
        raise ValueError(
            f"layers_block_type holds {unknown}, which Nemotron-H's importer does not know; "
            f"the kinds imported are {sorted(_KINDS)}"
        )
    return tuple(_KINDS[t] for t in c.layers_block_type)


def nemotron_h_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a Nemotron-H config (module docstring)."""
    c = hf_config
    kinds = _kinds(c)
    if c.mamba_hidden_act != "silu":
        raise ValueError(f"mamba_hidden_act={c.mamba_hidden_act!r}: our Mamba-2 mixer's is silu")
    mixers = MixerConfig(
        layers=kinds,
        mlp_layers=tuple(kind == "none" for kind in kinds),
        d_conv=c.conv_kernel,
        conv_bias=bool(c.use_conv_bias),
        proj_bias=bool(c.use_bias),
        n_ssm_heads=c.mamba_num_heads,
        d_ssm_head=c.mamba_head_dim,
        d_state=c.ssm_state_size,
        n_ssm_groups=c.n_groups,
        dt_min=float(c.time_step_limit[0]),
        dt_max=float(c.time_step_limit[1]),
        ssm_norm_eps=c.layer_norm_epsilon,
    )
    n_kv = c.num_key_value_heads
    return {
        "n_layers": len(kinds),
        "d_model": c.hidden_size,
        "n_ctx": c.max_position_embeddings,
        "d_vocab": c.vocab_size,
        "n_heads": c.num_attention_heads,
        "d_head": c.head_dim,
        "n_key_value_heads": None if n_kv == c.num_attention_heads else n_kv,
        "act_fn": _translate.activation(c.mlp_hidden_act, "mlp_hidden_act"),
        "gated_mlp": False,
        "normalization_type": "RMS",
        "eps": c.layer_norm_epsilon,
        "attn_scale": c.head_dim**0.5,
        "positional_embedding_type": "none",  # its attention reads no positions
        "mixers": mixers,
        **_feed_forward_fields(c),
    }


def _feed_forward_fields(c: Any) -> dict[str, Any]:
    """The MLPs' widths, and the mixture of experts' fields where "moe" layers hold one."""
    moe = tuple(t == "moe" for t in c.layers_block_type)
    if not any(moe):
        return {"d_mlp": c.intermediate_size}
    if c.moe_latent_size is not None:
        raise ValueError(
            f"moe_latent_size={c.moe_latent_size}: the experts' latent projection (fc1_latent_"
            f"proj, fc2_latent_proj around them) is not imported; give moe_latent_size=None"
        )
    return {
        **routing(c.n_routed_experts, c.num_experts_per_tok, c.norm_topk_prob),
        "d_mlp": c.moe_intermediate_size,
        "d_mlp_dense": None if all(moe) else c.intermediate_size,
        "moe_layers": moe,
        "d_mlp_shared": c.moe_shared_expert_intermediate_size,
        "router_scoring": "sigmoid",
        "n_expert_groups": c.n_group or 1,
        "topk_expert_groups": c.topk_group or 1,
        "routed_scaling_factor": float(c.routed_scaling_factor),
    }


def _attention_rules(cfg: HookedTransformerConfig) -> list[Rule]:
    """An attention layer's rules (`mixer.q_proj`, ...: no biases)."""
    grouped = cfg.n_kv_heads != cfg.n_heads
    kv, k, v = ("kv_head", "_W_K", "_W_V") if grouped else ("head", "W_K", "W_V")
    a, b = f"{_AT}.mixer", "blocks.{layer}.attn"
    return [
        Rule(f"{b}.W_Q", f"{a}.q_proj.weight", "(head d_head) d_model -> head d_model d_head"),
        Rule(f"{b}.{k}", f"{a}.k_proj.weight", f"({kv} d_head) d_model -> {kv} d_model d_head"),
        Rule(f"{b}.{v}", f"{a}.v_proj.weight", f"({kv} d_head) d_model -> {kv} d_model d_head"),
        Rule(f"{b}.W_O", f"{a}.o_proj.weight", "d_model (head d_head) -> head d_head d_model"),
        zeros(f"{b}.b_Q", "head d_head"),
        zeros(f"{b}.{k.replace('W', 'b')}", f"{kv} d_head"),
        zeros(f"{b}.{v.replace('W', 'b')}", f"{kv} d_head"),
        zeros(f"{b}.b_O", "d_model"),
    ]


def _mlp_rules(a: str, b: str, width: str, bias: bool) -> list[Rule]:
    """A plain MLP's rules, HF `{a}.up_proj`, `{a}.down_proj` -> our `{b}`, `width` wide."""
    w_in, w_out = f"{width} d_model -> d_model {width}", f"d_model {width} -> {width} d_model"
    return [
        Rule(f"{b}.W_in", f"{a}.up_proj.weight", w_in),
        Rule(f"{b}.b_in", f"{a}.up_proj.bias", f"{width} -> {width}") if bias else zeros(
            f"{b}.b_in", width),
        Rule(f"{b}.W_out", f"{a}.down_proj.weight", w_out),
        Rule(f"{b}.b_out", f"{a}.down_proj.bias", "d_model -> d_model") if bias else zeros(
            f"{b}.b_out", "d_model"),
    ]  # fmt: skip


def _moe_rules(c: Any, cfg: HookedTransformerConfig, live: bool) -> list[Rule]:
    """A mixture of experts' rules: the router and its choice bias, the plain experts
    (stacked in a live model, one tensor per expert in its files), the shared expert."""
    a, b = f"{_AT}.mixer", "blocks.{layer}.mlp"
    if live:
        experts = [
            Rule(f"{b}.W_in", f"{a}.experts.up_proj",
                 "expert d_mlp d_model -> expert d_model d_mlp"),
            Rule(f"{b}.W_out", f"{a}.experts.down_proj",
                 "expert d_model d_mlp -> expert d_mlp d_model"),
        ]  # fmt: skip
    else:
        n = cfg.num_experts
        experts = [
            Rule(f"{b}.W_in", f"{a}.experts.{{expert}}.up_proj.weight", MLP_IN, experts=n),
            Rule(f"{b}.W_out", f"{a}.experts.{{expert}}.down_proj.weight", MLP_OUT, experts=n),
        ]
    return [
        Rule(f"{b}.W_router", f"{a}.gate.weight", "expert d_model -> d_model expert"),
        zeros(f"{b}.b_router", "expert"),
        Rule(f"{b}.b_router_choice", f"{a}.gate.e_score_correction_bias", "expert -> expert"),
        *experts,
        zeros(f"{b}.b_in", "expert d_mlp"),
        zeros(f"{b}.b_out", "expert d_model"),
        *_mlp_rules(f"{a}.shared_experts", f"{b}.shared_expert", "d_mlp_shared",
                    bool(c.mlp_bias)),
    ]  # fmt: skip


def _layer_rules(c: Any, cfg: HookedTransformerConfig, layer: int, live: bool) -> list[Rule]:
    """Layer `layer`'s rules, `{layer}` unexpanded: its norm and its sublayer."""
    kind = cfg.mixers.layers[layer]
    width = "d_mlp_dense" if cfg.is_moe else "d_mlp"
    sublayer = {
        "attention": lambda: _attention_rules(cfg),
        "mamba2": lambda: _mamba2_rules(
            f"{_AT}.mixer", "blocks.{layer}.mixer", bool(c.use_bias), bool(c.use_conv_bias)
        ),
        "none": lambda: _moe_rules(c, cfg, live) if cfg.layer_is_moe(layer) else _mlp_rules(
            f"{_AT}.mixer", "blocks.{layer}.mlp", width, bool(c.mlp_bias)),
    }[kind]()  # fmt: skip
    norm = "ln2" if kind == "none" else "ln1"
    return [Rule(f"blocks.{{layer}}.{norm}.w", f"{_AT}.norm.weight", "d_model -> d_model"),
            *sublayer]  # fmt: skip


def nemotron_h_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """Nemotron-H's table: each layer's rules by its kind, then the embeddings and norm."""
    per_layer = [
        Rule(**{**rule.__dict__, "ours": rule.ours.replace("{layer}", str(i)),
                "hf": None if rule.hf is None else rule.hf.replace("{layer}", str(i))})
        for i in range(cfg.n_layers)
        for rule in _layer_rules(hf_config, cfg, i, live=hf_model is not None)
    ]  # fmt: skip
    rules = [
        Rule("embed.W_E", "model.embeddings.weight", "d_vocab d_model -> d_vocab d_model"),
        *per_layer,
        Rule("ln_final.w", "model.norm_f.weight", "d_model -> d_model"),
        Rule("unembed.W_U", "lm_head.weight", "d_vocab_out d_model -> d_model d_vocab_out"),
        zeros("unembed.b_U", "d_vocab_out"),
    ]
    # Its checkpoints store the base model as `backbone.` (`transformers` renames it on load
    # and back on save).
    saved = {name: (f"backbone.{name.removeprefix('model.')}",) for r in rules
             for name in r.read_names() if name.startswith("model.")}  # fmt: skip
    tied = {k: (*v, "backbone.embeddings.weight")
            for k, v in tied_unembedding(hf_config, "model.embeddings.weight").items()}  # fmt: skip
    return Table(
        rules=tuple(rules),
        aliases=saved | tied,
        label="Nemotron-H",
        base_prefix="model.",
    )


FAMILY = Family("NemotronHForCausalLM", "nemotron_h", nemotron_h_fields, nemotron_h_table)
