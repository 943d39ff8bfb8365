"""The fields of `HookedTransformerConfig`: the allowed values of each, in one table.

`FIELD_SPECS` holds one `FieldSpec` per field (its type, its range or choices, whether None
is allowed before defaults are derived), and the tuples of choices the fields name
(`ACT_FNS`, `NORMALIZATION_PLACEMENTS`, ...); `config.py` checks every field against it on
construction, so every bad value gets the same shape of error.
"""

import torch

from hookedattn.core._field_specs import FieldSpec
from hookedattn.core.mixer_config import MixerConfig

ACT_FNS: tuple[str, ...] = ("relu", "gelu", "gelu_new", "silu", "relu2", "solu_ln", "xielu")
NORMALIZATION_TYPES: tuple[str | None, ...] = (None, "LN", "LNPre", "RMS", "RMSPre")
NORMALIZATION_PLACEMENTS: tuple[str, ...] = ("pre", "post", "pre_and_post", "post_residual")
POSITIONAL_EMBEDDING_TYPES: tuple[str, ...] = ("standard", "shortformer", "rotary", "alibi", "none")
ATTN_TYPES: tuple[str, ...] = ("global", "local")
ROUTER_SCORINGS: tuple[str, ...] = ("softmax", "sigmoid", "softmax_biased", "sparsemixer")
ATTN_GATES: tuple[str, ...] = ("sigmoid", "softplus", "routed")
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


_POSITIVE = FieldSpec(float, low=0.0, low_open=True)
_OPTIONAL_POSITIVE = FieldSpec(float, low=0.0, low_open=True, optional=True)
_FLAG = FieldSpec(bool)

# One entry per field: its type, range or choices, and whether None is allowed (before
# defaults are derived: `n_heads=None` means "from d_model and d_head").
FIELD_SPECS: dict[str, FieldSpec] = {
    "n_layers": FieldSpec(int, low=0, high=100_000),
    "d_model": FieldSpec(int, low=1, high=1 << 20),
    "n_ctx": FieldSpec(int, low=1, high=1 << 24),
    "d_vocab": FieldSpec(int, low=1, high=1 << 24),
    "n_heads": FieldSpec(int, low=1, high=1 << 16, optional=True),
    "d_head": FieldSpec(int, low=1, high=1 << 16, optional=True),
    "d_mlp": FieldSpec(int, low=1, high=1 << 22, optional=True),
    "act_fn": FieldSpec(str, choices=ACT_FNS),
    "attn_only": _FLAG,
    "normalization_type": FieldSpec(str, choices=NORMALIZATION_TYPES, optional=True),
    "normalization_placement": FieldSpec(str, choices=NORMALIZATION_PLACEMENTS),
    "positional_embedding_type": FieldSpec(str, choices=POSITIONAL_EMBEDDING_TYPES),
    "rotary_dim": FieldSpec(int, low=2, high=1 << 16, optional=True),
    "rotary_base": _POSITIVE,
    "rotary_scaling_factor": _POSITIVE,
    "rotary_pairs": FieldSpec(int, low=0, high=1 << 15, optional=True),
    "use_NTK_by_parts_rope": _FLAG,
    "NTK_by_parts_factor": _POSITIVE,
    "NTK_by_parts_low_freq_factor": _POSITIVE,
    "NTK_by_parts_high_freq_factor": _POSITIVE,
    "NTK_original_ctx_len": FieldSpec(int, low=1, high=1 << 24),
    "rotary_base_local": _OPTIONAL_POSITIVE,
    "rotary_scaling_factor_local": _POSITIVE,
    "rotary_dim_local": FieldSpec(int, low=2, high=1 << 16, optional=True),
    "use_yarn_rope": _FLAG,
    "yarn_factor": _POSITIVE,
    "yarn_beta_fast": _POSITIVE,
    "yarn_beta_slow": _POSITIVE,
    "yarn_original_ctx_len": FieldSpec(int, low=1, high=1 << 24),
    "yarn_truncate": _FLAG,
    "rotary_attention_factor": _POSITIVE,
    "rotary_table_float32": _FLAG,
    "rotary_angles_float64": _FLAG,
    "rotary_layers": FieldSpec(tuple, optional=True),
    "ln1_layers": FieldSpec(tuple, optional=True),
    "placement_layers": FieldSpec(tuple, optional=True),
    "normed_skip": _FLAG,
    "attn_skip_scale": FieldSpec(float),
    "mlp_skip_scale": FieldSpec(float),
    "alibi_slopes": FieldSpec(tuple, optional=True),
    "d_vocab_out": FieldSpec(int, low=1, high=1 << 24, optional=True),
    "n_key_value_heads": FieldSpec(int, low=1, high=1 << 16, optional=True),
    "q_lora_rank": FieldSpec(int, low=1, high=1 << 20, optional=True),
    "kv_lora_rank": FieldSpec(int, low=1, high=1 << 20, optional=True),
    "d_head_v": FieldSpec(int, low=1, high=1 << 16, optional=True),
    "n_heads_layers": FieldSpec(tuple, optional=True),
    "d_head_layers": FieldSpec(tuple, optional=True),
    "n_key_value_heads_layers": FieldSpec(tuple, optional=True),
    "attn_sinks_layers": FieldSpec(tuple, optional=True),
    "latent_norm_eps": FieldSpec(float, low=0.0, low_open=True, high=1.0),
    "index_topk": FieldSpec(int, low=1, high=1 << 24, optional=True),
    "index_n_heads": FieldSpec(int, low=1, high=1 << 16),
    "index_head_dim": FieldSpec(int, low=1, high=1 << 16, optional=True),
    "index_norm_eps": FieldSpec(float, low=0.0, low_open=True, high=1.0),
    "indexer_layers": FieldSpec(tuple, optional=True),
    "gated_mlp": _FLAG,
    "mlp_gate_bias": _FLAG,
    "embed_norm": _FLAG,
    "embed_norm_before_positions": _FLAG,
    "d_embed": FieldSpec(int, low=1, high=1 << 20, optional=True),
    "d_unembed": FieldSpec(int, low=1, high=1 << 20, optional=True),
    "unembed_transform": FieldSpec(str, choices=ACT_FNS[:-2], optional=True),  # elementwise
    "parallel_attn_mlp": _FLAG,
    "use_qk_norm": _FLAG,
    "qk_norm_per_head": _FLAG,
    "qk_norm_after_rotary": _FLAG,
    "qk_norm_type": FieldSpec(str, choices=("RMS", "LN")),
    "attn_sub_norm": _FLAG,
    "mlp_sub_norm": _FLAG,
    "attn_scale": _OPTIONAL_POSITIVE,
    "attn_scores_soft_cap": _OPTIONAL_POSITIVE,
    "output_logits_soft_cap": _OPTIONAL_POSITIVE,
    "use_attn_sinks": _FLAG,
    "differential_attention": _FLAG,
    "attn_gate": FieldSpec(str, choices=ATTN_GATES, optional=True),
    "attn_gate_per_head": _FLAG,
    "attn_gate_top_k": FieldSpec(int, low=1, high=1 << 16, optional=True),
    "window_size": FieldSpec(int, low=1, high=1 << 24, optional=True),
    "attn_types": FieldSpec(tuple, item_choices=ATTN_TYPES, optional=True),
    "window_chunked": _FLAG,
    "query_temperature_floor": FieldSpec(int, low=1, high=1 << 24, optional=True),
    "query_temperature_scale": FieldSpec(float, low=0.0),
    "qk_norm_layers": FieldSpec(tuple, optional=True),
    "use_v_norm": _FLAG,
    "resid_post_scale": _FLAG,
    "d_per_layer_input": FieldSpec(int, low=1, high=1 << 20, optional=True),
    "d_vocab_per_layer_input": FieldSpec(int, low=1, high=1 << 24, optional=True),
    "n_kv_shared_layers": FieldSpec(int, low=0, high=1 << 16),
    "d_mlp_kv_shared": FieldSpec(int, low=1, high=1 << 22, optional=True),
    "expert_input_weighted": _FLAG,
    "router_expert_scale": _FLAG,
    "moe_beside_mlp": _FLAG,
    "num_experts": FieldSpec(int, low=1, high=1 << 16, optional=True),
    "experts_per_token": FieldSpec(int, low=1, high=1 << 16, optional=True),
    "norm_topk_prob": _FLAG,
    "norm_topk_eps": FieldSpec(float, low=0.0),
    "d_mlp_shared": FieldSpec(int, low=1, high=1 << 22, optional=True),
    "shared_expert_gate": _FLAG,
    "swiglu_limit": _OPTIONAL_POSITIVE,
    "swiglu_alpha": _POSITIVE,
    "router_scoring": FieldSpec(str, choices=ROUTER_SCORINGS),
    "n_expert_groups": FieldSpec(int, low=1, high=1 << 16),
    "topk_expert_groups": FieldSpec(int, low=1, high=1 << 16),
    "group_score_experts": FieldSpec(int, low=1, high=1 << 16),
    "routed_scaling_factor": _POSITIVE,
    "sparsemixer_jitter_eps": FieldSpec(float, low=0.0),
    "n_dense_layers": FieldSpec(int, low=0, high=100_000),
    "moe_layers": FieldSpec(tuple, optional=True),
    "d_mlp_dense": FieldSpec(int, low=1, high=1 << 22, optional=True),
    "moe_out_norm": _FLAG,
    "mixers": FieldSpec(MixerConfig, optional=True),
    "eps": FieldSpec(float, low=0.0, low_open=True, high=1.0),
    "use_attn_result": _FLAG,
    "use_split_qkv_input": _FLAG,
    "use_hook_mlp_in": _FLAG,
    "use_attn_in": _FLAG,
    "use_hook_mixer_in": _FLAG,
    "use_fused_kernels": _FLAG,
    "dtype": FieldSpec(torch.dtype, choices=tuple(DTYPES.values())),
    "device": FieldSpec(str),
    "seed": FieldSpec(int, low=0, high=(1 << 63) - 1, optional=True),
    "init_range": _OPTIONAL_POSITIVE,
    "init_weights": _FLAG,
    "model_name": FieldSpec(str),
    "original_architecture": FieldSpec(str, optional=True),
}
