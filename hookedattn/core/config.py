"""The configuration of a `HookedTransformer`: one frozen dataclass, validated on construction.

Every architectural variant (attention-only, the norm and where it sits, the positional map,
grouped keys and values, the attention window, a gated or parallel MLP) is decided here,
once; the model reads these fields when it builds its modules and never branches on them
inside `forward`. Each field is checked against one entry of `FIELD_SPECS` (its type and
its range or choices), so every bad value gets the same shape of error: the field, the
value, and what is allowed.
"""

import dataclasses
import json
import math
from typing import Any

import torch

from hookedattn.core._config_checks import ConfigChecks
from hookedattn.core._config_fields import (
    ACT_FNS,
    ATTN_GATES,
    ATTN_TYPES,
    DTYPES,
    FIELD_SPECS,
    NORMALIZATION_PLACEMENTS,
    NORMALIZATION_TYPES,
    POSITIONAL_EMBEDDING_TYPES,
    ROUTER_SCORINGS,
)
from hookedattn.core._config_layers import LayerQueries
from hookedattn.core._field_specs import check_field
from hookedattn.core._field_specs import closest as _closest
from hookedattn.core.mixer_config import MixerConfig

# The allowed values live in `_config_fields`; they are named here too, where readers of a
# config look for them.
__all__ = [
    "ACT_FNS",
    "ATTN_GATES",
    "ATTN_TYPES",
    "DTYPES",
    "FIELD_SPECS",
    "NORMALIZATION_PLACEMENTS",
    "NORMALIZATION_TYPES",
    "POSITIONAL_EMBEDDING_TYPES",
    "ROUTER_SCORINGS",
    "HookedTransformerConfig",
]


# The fields holding a tuple (one entry per layer or head), which JSON gives as lists.
_PER_LAYER_TUPLES = (
    "attn_types",
    "rotary_layers",
    "qk_norm_layers",
    "alibi_slopes",
    "moe_layers",
    "ln1_layers",
    "placement_layers",
    "n_heads_layers",
    "d_head_layers",
    "n_key_value_heads_layers",
    "attn_sinks_layers",
    "indexer_layers",
)


@dataclasses.dataclass(frozen=True)
class HookedTransformerConfig(ConfigChecks, LayerQueries):
    """Shape and variant of a `HookedTransformer`; field names follow TransformerLens.

    `n_heads` and `d_head` may each be left out when the other divides `d_model`; attention
    weights are stored per head (`W_Q: [head d_model d_head]`), so `d_model == n_heads *
    d_head` is not otherwise required. `d_vocab_out` defaults to `d_vocab`. `d_mlp` is
    required unless `attn_only`; `act_fn` defaults to "relu", as in TransformerLens, so a
    config ported from it builds the same MLP. `init_range` is the standard deviation of the normal
    initialisation (default `0.8 / sqrt(d_model)`, as TransformerLens). `attn_scale` divides
    the attention scores (default `sqrt(d_head)`). `seed` seeds the initialisation through a
    private generator, so the global torch RNG is left untouched.

    The variants real model families need:

    - `n_key_value_heads`: grouped-query attention; query head `h` reads key/value head
      `h // (n_heads // n_key_value_heads)`. None: one key/value head per query head.
    - `gated_mlp`: `act(x @ W_gate) * (x @ W_in + b_in)` before `W_out` (SwiGLU, GeGLU).
    - `mlp_gate_bias`: a dense gated MLP's gate has a bias too, `act(x @ W_gate + b_gate)`
      (RecurrentGemma's).
    - `parallel_attn_mlp`: attention and MLP both read `resid_pre` (GPT-NeoX, GPT-J).
    - `normalization_placement`: "pre" (norm before each sublayer), "post" (norm of each
      sublayer's output before it is added, OLMo 2), "pre_and_post" (both, Gemma 2),
      "post_residual" (the original Transformer's: a norm of the stream after each add,
      `resid_mid = ln_resid_mid(resid_pre + attn_out)`; GPT-1, BERT, BART; no final norm,
      the last block's `ln_resid_post` is it). `ln1_layers` (one flag per block; None:
      every block) says which blocks norm the attention's input: ModernBERT-decoder's
      first block reads the embeddings' norm as is (its `ln1` is the identity).
      `placement_layers` (one placement per block, "pre", "post" or "pre_and_post"; None:
      every block `normalization_placement`) places each block's norms on its own: OLMo
      Hybrid norms its attention blocks' writes ("post", OLMo 2's) and its gated delta net
      blocks' inputs ("pre", Qwen3-Next's).
    - `normed_skip`: each sublayer's skip path carries its normed input, not the stream
      (MiniMax: `resid_mid = attn_skip_scale * ln1(resid_pre) + attn(ln1(resid_pre))`,
      `resid_post = mlp_skip_scale * ln2(resid_mid) + mlp(ln2(resid_mid))`, DeepNorm's
      scaled skips on pre-norms); `attn_skip_scale`, `mlp_skip_scale` (1.0 unless
      `normed_skip`) scale the two skips. Needs a sequential block with "pre" norms.
    - `embed_norm`: a norm of the embeddings (`ln_embed`, after `W_E` and `W_pos` are
      added; BERT, BART; with `embed_norm_before_positions`, of `W_E[tokens]` alone, the
      positions added to its output: BlenderbotSmall). `unembed_transform`: an activation
      names BERT's head transform before `W_U`, `ln_unembed(act(x @ W_dense + b_dense))`
      (`components.unembed_transform`).
    - `d_embed`: the embeddings (`W_E`, `W_pos`, `ln_embed`) are this wide, and a learned
      projection `embed_proj` (`x @ W_proj + b_proj`) maps them to `d_model` before block 0
      (ELECTRA, RemBERT: `components.embed_projection`). None: `d_model`, no projection.
      `d_unembed`: the head transform's output and `W_U`'s rows are this wide (ELECTRA's,
      RemBERT's head); None: `d_model`.
    - `use_qk_norm`: an RMSNorm of queries and keys before the rotation, over each head
      (`qk_norm_per_head`, Qwen 3) or over all heads together (OLMo 2); after it with
      `qk_norm_after_rotary` (HunYuan). `qk_norm_type="LN"`: LayerNorms with gain and bias
      in their place (Persimmon's, per head). `qk_norm_layers` (one flag per block; None:
      every block) says which blocks norm them: Llama 4 norms them in its rotating blocks
      only. `use_v_norm`: a weightless RMSNorm of each value head (`attn.v_norm`, after
      `hook_v`), before the heads read the values (Gemma 4).
    - sub-norms (BitNet): `attn_sub_norm` norms every head's `z` together (one scale per
      position, over `(head d_head)`: `attn.sub_norm`, `hook_z_normed`) before `W_O` reads
      it, `hook_z` keeping the heads' outputs before it; `mlp_sub_norm` norms a gated MLP's
      neurons (`mlp.ln` over `d_mlp`, after `hook_mid`) before `W_out`, `hook_post` the
      normed neurons `W_out` reads. Both of `normalization_type`'s kind.
    - `attn_scores_soft_cap`, `output_logits_soft_cap`: `c * tanh(x / c)` (Gemma 2).
    - `window_size` with `attn_types`: a query reads only the `window_size` latest keys
      (itself included) in "local" layers; None `attn_types` makes every layer local.
      `window_chunked` makes the local layers' window fixed chunks instead (Llama 4's
      chunked attention): a query reads the keys of its own chunk of `window_size`
      positions, `key // window_size == query // window_size`, up to itself.
    - `query_temperature_floor` (Llama 4's `floor_scale`; None: off): in the blocks that do
      not rotate, every query is multiplied by `1 + query_temperature_scale * log(1 +
      floor((position + 1) / query_temperature_floor))` before the scores read it
      (`components.query_temperature`, `hook_q_tuned`), so that far positions attend more
      sharply (Nakanishi 2025, scalable softmax).
    - rotary: `rotary_dim` dims of each head rotated in GPT-NeoX's half-split layout,
      `rotary_base`, `rotary_scaling_factor` (linear scaling) and Llama 3's frequency
      bands (`use_NTK_by_parts_rope` and its `NTK_*` parameters, TransformerLens's names),
      or YaRN's (`use_yarn_rope` and its `yarn_*` parameters, GPT-OSS), whose cosines and
      sines are also multiplied by `rotary_attention_factor`. `rotary_base_local` gives
      the local layers a rotary of their own (Gemma 3): that base, scaled linearly by
      `rotary_scaling_factor_local`, over `rotary_dim_local` dimensions (None:
      `rotary_dim`; Gemma 4's local heads are narrower than its global ones); the global
      layers keep the rest. `rotary_layers`
      (one flag per block; None: every block) says which blocks rotate at all: SmolLM 3's
      every fourth block and Cohere 2's global ones attend without positions.
      `rotary_pairs` (None: all) keeps only the first, fastest, that many of the
      `rotary_dim / 2` pairs rotating and gives the rest frequency 0: `transformers`'
      "proportional" RoPE (LFM 3), where `partial_rotary_factor` says how many pairs turn
      but the frequencies and the pairing are those of the whole head.
      A float64 model computes its angles and their cosines in float64 (the frequencies
      stay the float32 constants the checkpoint was trained with); `rotary_table_float32`
      keeps them float32 in every dtype, for the models whose reference builds its
      cosines and sines once as a float32 table (GPT-J, CodeGen, RoFormer).
      `rotary_angles_float64` computes the frequencies and angles in float64 in every
      dtype, for a table its reference computes in float64 and then rounds (RoFormer's,
      with `rotary_table_float32`: float64 angles, a float32 table).
    - `use_attn_sinks`: each head has a learned logit `sinks[h]` that joins every query's
      softmax as one more key with no value, so a pattern row sums to less than one
      (GPT-OSS). `attn_sinks_layers` (one flag per block; None: every block) says which
      blocks have them: MiMo-V2-Flash's sliding-window blocks only.
    - attention shapes per block (MiMo-V2-Flash's sliding-window blocks have twice the
      key/value heads of its full ones; Gemma 4's global blocks wider heads):
      `n_heads_layers`, `d_head_layers`, `n_key_value_heads_layers` (one entry per block;
      None: every block `n_heads`, `d_head`, `n_key_value_heads`). Block `L`'s attention
      is built from `attention_config(L)`, this config with that block's entries as its
      own, so every piece sized by heads (the fused q/k/v weight, the KV cache, the
      per-head hook points) is that block's; `attn_scale` and `d_head_v` stay one value
      for every block, `rotary_dim` too but in the local blocks (`rotary_dim_local`).
      Stacks over layers (`model.W_Q`, `cache.stack`) need equal shapes and refuse
      otherwise: read `blocks[L].attn.W_Q` per block.
    - `d_head_v`: the width of a value head and of `z`, where it differs from `d_head`
      (MiMo-V2-Flash's, and latent attention's below).
    - `attn_gate` ("sigmoid", Qwen3-Next; "softplus", Laguna): each head's `z` is
      multiplied by `gate(x @ W_G[h] + b_G[h])` of the attention's input before `W_O`
      reads it, one factor per dimension of the head, or one per head
      (`attn_gate_per_head`); latent attention's too (Bailing Hybrid's, one per head).
      "routed" (JetMoE's mixture of attention heads): the query heads sharing a key/value
      head are experts, and each position keeps `attn_gate_top_k` of each group's, their
      gates the softmax of the chosen logits `x @ W_G[h] + b_G[h]`, the others' 0.
    - `differential_attention` (DiffLlama; Ye et al. 2024): query heads `i` and `i +
      n_heads / 2` read the same pair of value heads side by side, and their two `z` are
      subtracted, `z[i] - lambda z[i + n_heads / 2]`, RMS-normed per pair and scaled by
      `1 - lambda_init` before `W_O: [pair 2 d_head d_model]` reads them
      (`components.differential_attention`).
    - multi-head latent attention (`kv_lora_rank`; DeepSeek V2/V3, Kimi K2): keys and
      values are read from a shared low-rank latent of the stream (normed, width
      `kv_lora_rank`), queries from one of width `q_lora_rank` (None: straight from the
      stream), and each query/key head ends in `rotary_dim` rotated dimensions whose key
      part is one projection shared by all heads; `d_head` is the query/key head width
      (unrotated plus rotated parts), `d_head_v` the value head width (None: `d_head`;
      `d_value` is the width either way); the
      latents' RMSNorms have their own epsilon `latent_norm_eps`.
      `components.latent_attention`.
    - a lightning indexer (`index_topk`; DeepSeek V3.2's sparse attention, GLM-MoE-DSA):
      in latent attention, each query reads only the `index_topk` keys that a small
      scorer of its own ranks highest (`index_n_heads` heads `index_head_dim` wide, its
      key's LayerNorm with epsilon `index_norm_eps`); `indexer_layers` (one flag per
      block; None: every block) says which blocks select. `components.indexer`.
    - mixture of experts (`num_experts`, `experts_per_token`: TransformerLens's names): each MLP is
      a router choosing `experts_per_token` of `num_experts` experts of width `d_mlp` per token
      (gated as `gated_mlp` says, as are the shared expert and the dense MLPs beside them:
      Nemotron-H's are plain, `act(x @ W_in) @ W_out`), their outputs mixed by the router's softmax
      weights (over the chosen experts only when `norm_topk_prob`, their sum plus
      `norm_topk_eps`: LFM2-MoE's 1e-6, 0 elsewhere). `d_mlp_shared` adds an expert
      every token uses (Qwen2-MoE), scaled by `sigmoid(x @ W_shared_gate)` when
      `shared_expert_gate`. `swiglu_limit` makes every expert GPT-OSS's clamped SwiGLU, `(clamp(lin,
      +-limit) + 1) * g * sigmoid(swiglu_alpha * g)` with `g = min(gate, limit)`, in place of
      `act_fn`. `router_scoring="sigmoid"` (DeepSeek V3) scores each expert by `sigmoid(logit)` and
      chooses by the scores plus a learned choice bias (`b_router_choice`); `"softmax_biased"`
      (Ernie 4.5) chooses by the softmax's probabilities plus that bias and weighs by the
      probabilities; `"sparsemixer"` (Phi-3.5-MoE) chooses the largest logits and weighs each by
      a softmax over the logits within `2 * sparsemixer_jitter_eps` of it (relatively), among
      those not chosen before (`components.sparsemixer`). Any router may choose only among the
      experts of the `topk_expert_groups` best of `n_expert_groups` groups (a group's score: the
      sum of its `group_score_experts` best experts'; DeepSeek V3 2, V2 1), and weighs by the
      scores (renormalised when `norm_topk_prob`) times `routed_scaling_factor`.
      `n_dense_layers` keeps a dense MLP of width `d_mlp_dense` in the first blocks (DeepSeek's
      `first_k_dense_replace`); `moe_layers`, one flag per block, says which blocks hold the
      mixture in any pattern (Jamba's every other, Qwen's `decoder_sparse_step`), the others
      a dense MLP `d_mlp_dense` wide. Give one of the two.
      `moe_out_norm` norms the mixture's whole output (routed plus shared experts) before it
      is added, in the blocks that hold one (A.X-K1's `post_mlp_layernorm`): it is their
      `ln2_post`, so `hook_mlp_out` holds the normed write (pre-norm placement only).
      `expert_input_weighted` (Llama 4) multiplies each chosen expert's input by its
      router weight instead of its output: `expert_e(g_e * x)`, summed as they are.
      `router_expert_scale` (Gemma 4) multiplies each chosen expert's weight by a learned
      scale of that expert's own (`mlp.w_expert_scale`, 1 as built, after any renormalisation).
      `moe_beside_mlp` (Gemma 4's `enable_moe_block`): every block holds the mixture beside
      a dense MLP `d_mlp_dense` wide, each behind norms of its own, the router reading the
      stream through a norm of its own (`components.block`: `ln_router`).
    - `resid_post_scale` (Gemma 4's `layer_scalar`): each block multiplies the stream it
      leaves by a learned scalar of its own, `resid_post = w * (resid_mid + mlp_out)`
      (`components.resid_scale`: `blocks.L.resid_scale.w`, the unscaled sum at its
      `hook_in`, so the sublayers' writes still sum to it).
    - `d_per_layer_input` (Gemma 4's `hidden_size_per_layer_input`; None: off): every
      block reads an input of its own that wide, made once per forward from the tokens
      (a table of `d_vocab_per_layer_input` rows, None: `d_vocab`) and the embedding,
      through a third sublayer after its MLP (`components.per_layer_input`).
    - `n_kv_shared_layers` (Gemma 4's `num_kv_shared_layers`; 0: off): the last that many
      blocks compute no keys or values of their own; each reads those of the last earlier
      block of its attention type (`kv_source_layer`; `components.shared_kv_attention`).
      `d_mlp_kv_shared` (None: `d_mlp`) is their MLPs' width (Gemma 4's
      `use_double_wide_mlp`: `2 * d_mlp`).
    - `mixers` (a `MixerConfig`): a hybrid model, whose blocks hold attention or another
      sublayer that mixes positions (a short convolution, a Mamba-1 or Mamba-2 layer, a gated
      delta net) in its place, or beside it (Falcon-H1), or blocks of one sublayer
      (Nemotron-H): `mixer_config`.
    - `positional_embedding_type`: "standard" adds the learned `W_pos[position]` to the
      residual stream; "shortformer" (Press et al. 2021, TransformerLens's toy models
      `attn-only-*`) adds it, in every layer, to the normed inputs of the queries and keys
      only (`ln1(resid) + W_pos[position]`), never to the values or the stream; "rotary"
      rotates queries and keys; "alibi" (Press et al. 2022, BLOOM, MPT) adds
      `slope[h] * (key_position - query_position)` to each head's scores after the scale,
      `alibi_slopes` one slope per head (None: the paper's, `2 ** (-8 r / n)` for
      `n` the power of two at or above `n_heads`, in BLOOM's and MPT's order for other
      head counts: `components.alibi`); "none" has no positional signal.
    - `act_fn="solu_ln"` (TransformerLens's SoLU models): `SoLU(x) = x * softmax(x)` over
      the neurons (Elhage et al. 2022), then a LayerNorm over the neurons (`mlp.ln`, with
      its own gain and bias where `normalization_type` is "LN", weightless otherwise, as
      TransformerLens builds it); a plain MLP only (not gated, not experts).
    - `act_fn="xielu"` (Apertus): xIELU with four learned scalars per layer, parameters of
      the MLP's `act_fn` (`components.xielu`); dense MLPs only (not experts).
    - `use_fused_kernels`: where no hook reads a layer's scores or pattern, attention runs
      as one fused kernel (`scaled_dot_product_attention`), and a norm whose hook points
      are idle as `layer_norm` / `rms_norm`; the same numbers to the dtype's rounding.
      False writes everything out always, so a cached run is bit-for-bit the plain forward.
    - `init_weights=False` leaves parameters uninitialised, for loading weights into.
    """

    n_layers: int
    d_model: int
    n_ctx: int
    d_vocab: int
    n_heads: int | None = None
    d_head: int | None = None
    d_mlp: int | None = None
    # Choices are plain `str` here (see ACT_FNS etc.) so that a bad value gets our error,
    # naming the closest valid choice, rather than a generic type-check failure.
    act_fn: str = "relu"
    attn_only: bool = False
    normalization_type: str | None = "LN"
    normalization_placement: str = "pre"
    ln1_layers: tuple[bool, ...] | None = None
    placement_layers: tuple[str, ...] | None = None
    normed_skip: bool = False
    attn_skip_scale: float = 1.0
    mlp_skip_scale: float = 1.0
    positional_embedding_type: str = "standard"
    rotary_dim: int | None = None
    rotary_base: float = 10000.0
    rotary_scaling_factor: float = 1.0
    rotary_pairs: int | None = None
    use_NTK_by_parts_rope: bool = False
    NTK_by_parts_factor: float = 8.0
    NTK_by_parts_low_freq_factor: float = 1.0
    NTK_by_parts_high_freq_factor: float = 4.0
    NTK_original_ctx_len: int = 8192
    rotary_base_local: float | None = None
    rotary_scaling_factor_local: float = 1.0
    rotary_dim_local: int | None = None
    use_yarn_rope: bool = False
    yarn_factor: float = 1.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_original_ctx_len: int = 4096
    yarn_truncate: bool = True
    rotary_attention_factor: float = 1.0
    rotary_table_float32: bool = False
    rotary_angles_float64: bool = False
    rotary_layers: tuple[bool, ...] | None = None
    alibi_slopes: tuple[float, ...] | None = None
    d_vocab_out: int | None = None
    n_key_value_heads: int | None = None
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    d_head_v: int | None = None
    n_heads_layers: tuple[int, ...] | None = None
    d_head_layers: tuple[int, ...] | None = None
    n_key_value_heads_layers: tuple[int, ...] | None = None
    attn_sinks_layers: tuple[bool, ...] | None = None
    latent_norm_eps: float = 1e-6
    index_topk: int | None = None
    index_n_heads: int = 1
    index_head_dim: int | None = None
    index_norm_eps: float = 1e-6
    indexer_layers: tuple[bool, ...] | None = None
    gated_mlp: bool = False
    mlp_gate_bias: bool = False
    embed_norm: bool = False
    embed_norm_before_positions: bool = False
    d_embed: int | None = None
    unembed_transform: str | None = None
    d_unembed: int | None = None
    parallel_attn_mlp: bool = False
    use_qk_norm: bool = False
    qk_norm_per_head: bool = True
    qk_norm_after_rotary: bool = False
    qk_norm_type: str = "RMS"
    qk_norm_layers: tuple[bool, ...] | None = None
    use_v_norm: bool = False
    attn_sub_norm: bool = False
    mlp_sub_norm: bool = False
    attn_scale: float | None = None
    attn_scores_soft_cap: float | None = None
    output_logits_soft_cap: float | None = None
    use_attn_sinks: bool = False
    differential_attention: bool = False
    attn_gate: str | None = None
    attn_gate_per_head: bool = False
    attn_gate_top_k: int | None = None
    window_size: int | None = None
    attn_types: tuple[str, ...] | None = None
    window_chunked: bool = False
    query_temperature_floor: int | None = None
    query_temperature_scale: float = 0.1
    num_experts: int | None = None
    experts_per_token: int | None = None
    norm_topk_prob: bool = False
    norm_topk_eps: float = 0.0
    d_mlp_shared: int | None = None
    shared_expert_gate: bool = False
    swiglu_limit: float | None = None
    swiglu_alpha: float = 1.0
    router_scoring: str = "softmax"
    n_expert_groups: int = 1
    topk_expert_groups: int = 1
    group_score_experts: int = 2
    routed_scaling_factor: float = 1.0
    sparsemixer_jitter_eps: float = 0.01
    n_dense_layers: int = 0
    moe_layers: tuple[bool, ...] | None = None
    d_mlp_dense: int | None = None
    moe_out_norm: bool = False
    expert_input_weighted: bool = False
    router_expert_scale: bool = False
    moe_beside_mlp: bool = False
    resid_post_scale: bool = False
    d_per_layer_input: int | None = None
    d_vocab_per_layer_input: int | None = None
    n_kv_shared_layers: int = 0
    d_mlp_kv_shared: int | None = None
    mixers: MixerConfig | None = None
    eps: float = 1e-5
    use_attn_result: bool = False
    use_split_qkv_input: bool = False
    use_hook_mlp_in: bool = False
    use_attn_in: bool = False
    use_hook_mixer_in: bool = False
    use_fused_kernels: bool = True
    dtype: torch.dtype | str = torch.float32
    device: str = "cpu"
    seed: int | None = None
    init_range: float | None = None
    init_weights: bool = True
    model_name: str = "custom"
    original_architecture: str | None = None

    def __post_init__(self) -> None:
        set_ = lambda field, value: object.__setattr__(self, field, value)
        if isinstance(self.dtype, str):
            if self.dtype not in DTYPES:
                raise ValueError(
                    f"unknown dtype {self.dtype!r}: {_closest(self.dtype, tuple(DTYPES))}"
                )
            set_("dtype", DTYPES[self.dtype])
        set_("mixers", MixerConfig.coerce(self.mixers))  # from JSON: a dict
        for field in _PER_LAYER_TUPLES:  # from JSON: lists
            if isinstance(getattr(self, field), list):
                set_(field, tuple(getattr(self, field)))
        for field in dataclasses.fields(self):
            set_(field.name, check_field(field.name, getattr(self, field.name), FIELD_SPECS))
        self._derive_heads()
        self._check_variants()
        for field, default in (
            ("d_vocab_out", self.d_vocab),
            ("attn_scale", math.sqrt(self.d_head)),
            ("init_range", 0.8 / math.sqrt(self.d_model)),
        ):
            if getattr(self, field) is None:
                set_(field, default)
        if self.positional_embedding_type == "rotary" and self.rotary_dim is None:
            set_("rotary_dim", self.d_head - self.d_head % 2)
        self._check_rotary()
        self._check_alibi()
        self._check_latent_attention()
        self._check_indexer()
        self._check_differential_attention()
        self._check_local_rotary()
        self._check_layer_shapes()
        self._check_resid_post_scale()
        self._check_kv_sharing()
        self._check_routed_gate()

    def _derive_heads(self) -> None:
        set_ = lambda field, value: object.__setattr__(self, field, value)
        if self.n_heads is None and self.d_head is None:
            raise ValueError("give n_heads or d_head (or both); got neither")
        for known, missing in (("d_head", "n_heads"), ("n_heads", "d_head")):
            if getattr(self, missing) is None:
                if self.d_model % getattr(self, known):
                    raise ValueError(
                        f"{missing} was left out, so d_model must be a multiple of {known}; "
                        f"got d_model={self.d_model}, {known}={getattr(self, known)}"
                    )
                set_(missing, self.d_model // getattr(self, known))
        kv = self.n_key_value_heads
        if kv == self.n_heads:  # one key/value head per query head: no grouping
            set_("n_key_value_heads", None)
        elif kv is not None and self.n_heads % kv:
            raise ValueError(
                f"n_key_value_heads={kv} must divide n_heads={self.n_heads}: each key/value "
                f"head serves a whole group of query heads"
            )

    @property
    def has_mlp(self) -> bool:
        """Whether each block has an MLP sublayer."""
        return not self.attn_only

    @property
    def _is_sequential(self) -> bool:
        return not self.attn_only and not self.parallel_attn_mlp

    @property
    def embed_width(self) -> int:
        """The width of the embeddings `W_E`, `W_pos` (`d_embed`, else `d_model`)."""
        return self.d_model if self.d_embed is None else self.d_embed

    @property
    def unembed_width(self) -> int:
        """The width `W_U` reads (`d_unembed`, else `d_model`)."""
        return self.d_model if self.d_unembed is None else self.d_unembed

    @property
    def has_learned_positions(self) -> bool:
        """Whether the model has a learned positional embedding `W_pos` ("standard": in the
        residual stream; "shortformer": in the query and key inputs only)."""
        return self.positional_embedding_type in ("standard", "shortformer")

    @property
    def is_moe(self) -> bool:
        """Whether each block's MLP is a mixture of experts (`num_experts` set)."""
        return self.num_experts is not None

    @property
    def d_value(self) -> int:
        """The width of a head's value and `z`: `d_head_v`, or `d_head` where it is None."""
        return self.d_head if self.d_head_v is None else self.d_head_v

    @property
    def is_latent_attention(self) -> bool:
        """Whether attention is multi-head latent attention (`kv_lora_rank` set)."""
        return self.kv_lora_rank is not None

    @property
    def n_kv_heads(self) -> int:
        """Key/value heads per layer: `n_key_value_heads`, or `n_heads` without grouping."""
        return self.n_heads if self.n_key_value_heads is None else self.n_key_value_heads

    @property
    def use_normalization_before_and_after(self) -> bool:
        """TransformerLens's name for `normalization_placement == "pre_and_post"`."""
        return self.normalization_placement == "pre_and_post"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict from which `from_dict` rebuilds this config."""
        out = dataclasses.asdict(self)
        out["dtype"] = next(name for name, dt in DTYPES.items() if dt == self.dtype)
        for field in ("attn_types", "alibi_slopes"):
            if getattr(self, field) is not None:
                out[field] = list(getattr(self, field))
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "HookedTransformerConfig":
        """Rebuild a config from `to_dict` output; unknown keys are an error that names them."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown config fields {unknown}; known fields are {sorted(known)}")
        if isinstance(data.get("mixers"), dict):  # JSON's form of a MixerConfig
            data = data | {"mixers": MixerConfig.coerce(data["mixers"])}
        lists = {k: tuple(data[k]) for k in _PER_LAYER_TUPLES if isinstance(data.get(k), list)}
        return cls(**(data | lists))

    def to_json(self) -> str:
        """The config as indented JSON text."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    def replace(self, **changes: Any) -> "HookedTransformerConfig":
        """A copy with some fields changed, validated again."""
        return dataclasses.replace(self, **changes)
