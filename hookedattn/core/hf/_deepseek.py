"""DeepSeek V3 (`DeepseekV3ForCausalLM`; Kimi K2 and other checkpoints of model type
`deepseek_v3` too), GLM-4-MoE-Lite (`Glm4MoeLiteForCausalLM`), built of the same modules
with its dense blocks named per layer (`mlp_layer_types`), and DeepSeek V2 (below).

Multi-head latent attention (`components.latent_attention`) in every block, and a dense
gated MLP in the first `first_k_dense_replace` blocks, a mixture of experts after them: a
sigmoid router over `n_routed_experts` SwiGLU experts of width `moe_intermediate_size`,
choosing `num_experts_per_tok` among the `topk_group` best of `n_group` groups by the scores
plus `e_score_correction_bias`, weighted by the scores (renormalised when
`norm_topk_prob`) times `routed_scaling_factor`, and `n_shared_experts` shared experts as one
ungated MLP `n_shared_experts * moe_intermediate_size` wide (`components.moe`).

The attention's HF tensors, and ours:

    q_a_proj [q_rank d_model], q_a_layernorm, q_b_proj [(head d_head) q_rank]
                             -> W_Q_a, b_Q_a, q_a_norm.w, W_Q [head q_rank d_head]
    (q_proj [(head d_head) d_model] -> W_Q [head d_model d_head], without q_lora_rank)
    kv_a_proj_with_mqa [(kv_rank + d_rope) d_model]
                             -> W_KV_a [d_model kv_rank], W_K_rope [d_model d_rope] (+ biases)
    kv_a_layernorm           -> kv_a_norm.w
    kv_b_proj [(head (d_nope + d_head_v)) kv_rank] -> W_KV_b [head kv_rank d_kv]
    o_proj [d_model (head d_head_v)] -> W_O

DeepSeek rotates interleaved pairs `(x0, x1), (x2, x3), ...` (`rope_interleave`, the
default); our rotary pairs `i` with `i + rotary_dim / 2`. The two are one permutation of the
rotated dimensions apart, applied to queries and keys alike, so the scores are the same: the
import reorders the rotated columns of `q_b_proj` (or `q_proj`) and `kv_a_proj_with_mqa`
evens first, then odds (HF computes its interleaved rotation in that order too, so our
rotated queries and keys are its own, value for value). The scale is `1 / sqrt(d_head)`
times YaRN's `mscale(factor, mscale_all_dim)` squared where the rotary is scaled.

DeepSeek V2 (`DeepseekV2ForCausalLM`) is the same attention (its rotary always on
interleaved pairs, computed as complex float32 numbers whatever the model's dtype: a
float64 model agrees with it to float32's rounding there) with a softmax router: "greedy"
top-k, or "group_limited_greedy" among the `topk_group` groups whose best expert scores
highest, never renormalised, times `routed_scaling_factor`; no choice bias. Checkpoints'
extra layers past `num_hidden_layers` (the multi-token prediction module) are not read.
"""

import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import Tensor

from hookedattn.core.config import HookedTransformerConfig
from hookedattn.core.hf import _moe, _translate
from hookedattn.core.hf._family import Family, tied_unembedding
from hookedattn.core.hf._llama import L
from hookedattn.core.hf._table import Rule, Table, zeros

FILES = _moe.ExpertFiles(
    router="mlp.gate.weight",
    gate="mlp.experts.{expert}.gate_proj.weight",
    up="mlp.experts.{expert}.up_proj.weight",
    down="mlp.experts.{expert}.down_proj.weight",
)
_LATENT = ("kv_rank", "d_rope")  # the pieces of kv_a_proj_with_mqa's rows


def deepseek_v3_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `transformers.DeepseekV3Config` (or GLM-4-MoE-Lite's)."""
    c = hf_config
    router = {
        "router_scoring": "sigmoid",
        "norm_topk_prob": bool(c.norm_topk_prob),
        "n_expert_groups": c.n_group or 1,
        "topk_expert_groups": c.topk_group or 1,
    }
    return _latent_attention_fields(c) | feed_forward(c, router)


def deepseek_v2_fields(hf_config: Any) -> dict[str, Any]:
    """Our config's fields for a `transformers.DeepseekV2Config`: V3's attention, a softmax
    router ("greedy", or "group_limited_greedy": a group's score is its best expert's), its
    weights never renormalised (V2's router ignores `norm_topk_prob`)."""
    c = hf_config
    if getattr(c, "mlp_bias", False):
        raise ValueError("mlp_bias=True cannot be imported: a gated MLP here has no gate bias")
    method = c.topk_method
    if method not in ("greedy", "group_limited_greedy"):
        raise ValueError(
            f"topk_method={method!r} cannot be imported; supported: 'greedy', "
            f"'group_limited_greedy'"
        )
    grouped = method == "group_limited_greedy"
    router = {
        "router_scoring": "softmax",
        "norm_topk_prob": False,
        "n_expert_groups": (c.n_group or 1) if grouped else 1,
        "topk_expert_groups": (c.topk_group or 1) if grouped else 1,
        "group_score_experts": 1,
    }
    return _latent_attention_fields(c) | feed_forward(c, router)


def _latent_attention_fields(c: Any) -> dict[str, Any]:
    """The shape, norms, rotary and latent attention of a DeepSeek config."""
    return {
        "n_layers": c.num_hidden_layers,
        "d_model": c.hidden_size,
        "n_ctx": c.max_position_embeddings,
        "d_vocab": c.vocab_size,
        "act_fn": _translate.activation(c.hidden_act),
        "gated_mlp": True,
        "normalization_type": "RMS",
        "eps": c.rms_norm_eps,
        **latent_attention_fields(c),
    }


def latent_attention_fields(c: Any, rotates: bool = True) -> dict[str, Any]:
    """The latent attention's fields of a config that spells them as DeepSeek's does
    (`q_lora_rank`, `kv_lora_rank`, `qk_nope_head_dim`, `qk_rope_head_dim`, `v_head_dim`):
    the heads, the latents' widths, the scale and the rotary (the importer by convention
    reads these for the other architectures built on it: Youtu, Kimi Linear, ...).
    `rotates=False` (Kimi Linear, whose model builds no rotary): the `qk_rope_head_dim`
    dimensions, the shared key part among them, stay unrotated in every block."""
    n_heads, d_rope = c.num_attention_heads, c.qk_rope_head_dim
    kv = getattr(c, "num_key_value_heads", None) or n_heads
    if kv != n_heads:
        raise ValueError(
            f"num_key_value_heads={kv} differs from num_attention_heads={n_heads}: latent "
            f"attention expands the latent into every head's own key and value (give "
            f"num_key_value_heads={n_heads})"
        )
    d_head = c.qk_nope_head_dim + d_rope
    rope = dict(getattr(c, "rope_parameters", None) or {})
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        raise ValueError(
            f"partial_rotary_factor={rope['partial_rotary_factor']} cannot be imported: latent "
            f"attention rotates all qk_rope_head_dim={d_rope} dimensions of its rotary part"
        )
    return {
        "n_heads": n_heads,
        "n_key_value_heads": None,
        "d_head": d_head,
        "d_head_v": c.v_head_dim,
        "q_lora_rank": c.q_lora_rank,
        "kv_lora_rank": c.kv_lora_rank,
        "attn_scale": math.sqrt(d_head) / _mscale_squared(rope),
        **(_translate.rotary(c, d_rope, yarn=True) if rotates else _unrotated(c, d_rope)),
    }


def _unrotated(c: Any, d_rope: int) -> dict[str, Any]:
    """The decoupled key part `d_rope` wide, rotated in no block (`rotary_layers`)."""
    return {
        "positional_embedding_type": "rotary",
        "rotary_dim": d_rope,
        "rotary_layers": (False,) * c.num_hidden_layers,
    }


def _mscale_squared(rope: dict[str, Any]) -> float:
    """YaRN's `mscale(factor, mscale_all_dim)` squared, by which a scaled rotary's model
    multiplies its scores (HF's `yarn_apply_mscale`); 1 for an unscaled rotary."""
    m_all = rope.get("mscale_all_dim")
    if rope.get("rope_type", "default") == "default" or not m_all:
        return 1.0
    factor = rope["factor"]
    mscale = 1.0 if factor <= 1 else 0.1 * m_all * math.log(factor) + 1.0
    return mscale * mscale


def feed_forward(c: Any, router: dict[str, Any]) -> dict[str, Any]:
    """Dense MLPs in the first `first_k_dense_replace` blocks (GLM-4-MoE-Lite: the "dense"
    entries of `mlp_layer_types`, anywhere), a mixture of experts routed by `router` in the
    others."""
    moe = _moe_blocks(c)
    if not any(moe):  # no block has experts
        return {"d_mlp": c.intermediate_size}
    n_shared = getattr(c, "n_shared_experts", None)  # MiMo-V2-Flash has none
    shared = c.moe_intermediate_size * n_shared if n_shared else None
    n_dense = moe.index(True)
    first = moe == tuple(i >= n_dense for i in range(len(moe)))
    return {
        **_moe.routing(c.n_routed_experts, c.num_experts_per_tok, router.pop("norm_topk_prob")),
        **router,
        "d_mlp": c.moe_intermediate_size,
        "d_mlp_shared": shared,
        "routed_scaling_factor": float(c.routed_scaling_factor),
        **({"n_dense_layers": n_dense} if first else {"moe_layers": moe}),
        "d_mlp_dense": c.intermediate_size if not all(moe) else None,
    }


def _moe_blocks(c: Any) -> tuple[bool, ...]:
    """Which blocks hold a mixture of experts: past `first_k_dense_replace`, or the "sparse"
    entries of `mlp_layer_types`; another kind there is refused."""
    kinds = getattr(c, "mlp_layer_types", None)
    if kinds is None:
        return tuple(i >= (c.first_k_dense_replace or 0) for i in range(c.num_hidden_layers))
    unknown = sorted(set(kinds) - {"dense", "sparse"})
    if unknown:
        raise ValueError(
            f"mlp_layer_types={list(kinds)} holds {unknown}, which cannot be imported: "
            "'dense' and 'sparse'"
        )
    return tuple(kind == "sparse" for kind in kinds)


def deepseek_v3_table(hf_config: Any, cfg: HookedTransformerConfig, hf_model: Any = None) -> Table:
    """DeepSeek V3: latent attention, dense then mixture-of-experts MLPs (module docstring)."""
    interleaved = bool(getattr(hf_config, "rope_interleave", True))
    bias = bool(getattr(hf_config, "attention_bias", False))
    moe = [i for i in range(cfg.n_layers) if cfg.layer_is_moe(i)]
    dense = [i for i in range(cfg.n_layers) if not cfg.layer_is_moe(i)]
    rules = [
        Rule("embed.W_E", "model.embed_tokens.weight", "d_vocab d_model -> d_vocab d_model"),
        *each_layer(_attention_rules(cfg, interleaved, bias), range(cfg.n_layers)),
        *each_layer(dense_rules(cfg), dense),
        *each_layer(moe_rules(cfg, live=hf_model is not None), moe),
        Rule("ln_final.w", "model.norm.weight", "d_model -> d_model"),
        Rule("unembed.W_U", "lm_head.weight", "d_vocab_out d_model -> d_model d_vocab_out"),
        zeros("unembed.b_U", "d_vocab_out"),
    ]
    # With n_shared_experts=0 HF keeps shared experts 0 neurons wide: nothing to read.
    none_shared = (r"\.mlp\.shared_experts\.",) if cfg.d_mlp_shared is None else ()
    beyond = rf"^model\.layers\.(?!({'|'.join(map(str, range(cfg.n_layers)))})\.)\d+\."
    return Table(
        rules=tuple(rules),
        aliases=tied_unembedding(hf_config, "model.embed_tokens.weight"),
        ignored=(r"rotary_emb\.inv_freq$", beyond, *none_shared),
        label="DeepSeek-V3",
        base_prefix="model.",
    )


def each_layer(rules: list[Rule], layers: Iterable[int]) -> list[Rule]:
    """`rules` for each of `layers` (`{layer}` filled in)."""
    at = lambda name, layer: None if name is None else name.replace("{layer}", str(layer))
    return [
        dataclasses.replace(rule, ours=at(rule.ours, layer), hf=at(rule.hf, layer))
        for layer in layers
        for rule in rules
    ]


def _attention_rules(cfg: HookedTransformerConfig, interleaved: bool, bias: bool) -> list[Rule]:
    return [
        Rule("blocks.{layer}.ln1.w", f"{L}.input_layernorm.weight", "d_model -> d_model"),
        *latent_attention_rules(cfg, f"{L}.self_attn", interleaved, bias),
        Rule("blocks.{layer}.ln2.w", f"{L}.post_attention_layernorm.weight", "d_model -> d_model"),
    ]


def latent_attention_rules(
    cfg: HookedTransformerConfig,
    a: str,
    interleaved: bool,
    bias: bool,
    out: Callable[[Tensor], Tensor] | None = None,
) -> list[Rule]:
    """The rules of a latent attention kept at `a` (`{layer}` in it), DeepSeek's names
    (module docstring); `out` adjusts `W_O`, `b_O` (a write scale folded in)."""
    b = "blocks.{layer}"
    d_nope = cfg.d_head - cfg.rotary_dim
    rotated = _deinterleaved(d_nope) if interleaved else None
    rotated_only = _deinterleaved(0) if interleaved else None
    kv_a = f"{a}.kv_a_proj_with_mqa"

    def latent_bias(ours: str, hf: str, axis: str, **kwargs: Any) -> Rule:
        return Rule(ours, hf, f"{axis} -> {axis}", **kwargs) if bias else zeros(ours, axis)

    if cfg.q_lora_rank is None:
        query = [
            Rule(
                f"{b}.attn.W_Q",
                f"{a}.q_proj.weight",
                "(head d_head) d_model -> head d_model d_head",
                adjust=rotated,
            )
        ]
    else:
        query = [
            Rule(f"{b}.attn.W_Q_a", f"{a}.q_a_proj.weight", "q_rank d_model -> d_model q_rank"),
            latent_bias(f"{b}.attn.b_Q_a", f"{a}.q_a_proj.bias", "q_rank"),
            Rule(f"{b}.attn.q_a_norm.w", f"{a}.q_a_layernorm.weight", "q_rank -> q_rank"),
            Rule(
                f"{b}.attn.W_Q",
                f"{a}.q_b_proj.weight",
                "(head d_head) q_rank -> head q_rank d_head",
                adjust=rotated,
            ),
        ]
    return [
        *query,
        Rule(f"{b}.attn.W_KV_a", f"{kv_a}.weight", "kv_rank d_model -> d_model kv_rank",
             split=_LATENT, part=0),
        latent_bias(f"{b}.attn.b_KV_a", f"{kv_a}.bias", "kv_rank", split=_LATENT, part=0),
        Rule(f"{b}.attn.kv_a_norm.w", f"{a}.kv_a_layernorm.weight", "kv_rank -> kv_rank"),
        Rule(f"{b}.attn.W_K_rope", f"{kv_a}.weight", "d_rope d_model -> d_model d_rope",
             split=_LATENT, part=1, adjust=rotated_only),
        latent_bias(f"{b}.attn.b_K_rope", f"{kv_a}.bias", "d_rope", split=_LATENT, part=1,
                    adjust=rotated_only),
        Rule(f"{b}.attn.W_KV_b", f"{a}.kv_b_proj.weight",
             "(head d_kv) kv_rank -> head kv_rank d_kv"),
        Rule(f"{b}.attn.W_O", f"{a}.o_proj.weight",
             "d_model (head d_head_v) -> head d_head_v d_model", adjust=out),
        Rule(f"{b}.attn.b_O", f"{a}.o_proj.bias", "d_model -> d_model", adjust=out) if bias
        else zeros(f"{b}.attn.b_O", "d_model"),
    ]  # fmt: skip


def _deinterleaved(start: int) -> Callable[[Tensor], Tensor]:
    """The last axis with its dimensions from `start` on reordered evens first, then odds:
    DeepSeek's interleaved rotary pairs as our rotary's halves (module docstring)."""

    def reorder(tensor: Tensor) -> Tensor:
        rotated = tensor[..., start:]
        return torch.cat([tensor[..., :start], rotated[..., 0::2], rotated[..., 1::2]], dim=-1)

    return reorder


def dense_rules(cfg: HookedTransformerConfig) -> list[Rule]:
    """A dense block's gated MLP (`d_mlp_dense` wide in a mixture of experts)."""
    m, hf = "blocks.{layer}.mlp", f"{L}.mlp"
    width = "d_mlp_dense" if cfg.is_moe else "d_mlp"
    return [
        Rule(f"{m}.W_gate", f"{hf}.gate_proj.weight", f"{width} d_model -> d_model {width}"),
        Rule(f"{m}.W_in", f"{hf}.up_proj.weight", f"{width} d_model -> d_model {width}"),
        zeros(f"{m}.b_in", width),
        Rule(f"{m}.W_out", f"{hf}.down_proj.weight", f"d_model {width} -> {width} d_model"),
        zeros(f"{m}.b_out", "d_model"),
    ]


def moe_rules(cfg: HookedTransformerConfig, live: bool) -> list[Rule]:
    """The router, its choice bias (the sigmoid router's), the experts and the shared
    experts."""
    rules = _moe.expert_rules(cfg, FILES, live=live)
    if cfg.router_scoring == "sigmoid":
        rules.append(
            Rule(
                "blocks.{layer}.mlp.b_router_choice",
                f"{L}.mlp.gate.e_score_correction_bias",
                "expert -> expert",
            )
        )
    if cfg.d_mlp_shared is None:
        return rules
    shared = [
        dataclasses.replace(rule, hf=rule.hf.replace("shared_expert.", "shared_experts."))
        if rule.hf else rule
        for rule in _moe.shared_expert_rules(gated=False)
    ]  # fmt: skip
    return rules + shared


DEEPSEEK_V3 = Family("DeepseekV3ForCausalLM", "deepseek_v3", deepseek_v3_fields, deepseek_v3_table)
DEEPSEEK_V2 = Family("DeepseekV2ForCausalLM", "deepseek_v2", deepseek_v2_fields, deepseek_v3_table)
# GLM-4-MoE-Lite (GLM-4.7-Flash): DeepSeek V3's modules, its dense blocks named per layer.
GLM4_MOE_LITE = Family(
    "Glm4MoeLiteForCausalLM", "glm4_moe_lite", deepseek_v3_fields, deepseek_v3_table
)
