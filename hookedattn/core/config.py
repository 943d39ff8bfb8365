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
)


@dataclasses.dataclass(frozen=True)
class HookedTransformerConfig:
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
      only.
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
      `rotary_scaling_factor_local`; the global layers keep the rest. `rotary_layers`
      (one flag per block; None: every block) says which blocks rotate at all: SmolLM 3's
      every fourth block and Cohere 2's global ones attend without positions.
      `rotary_pairs` (None: all) keeps only the first, fastest, that many of the
      `rotary_dim / 2` pairs rotating and gives the rest frequency 0: `transformers`'
      "proportional" RoPE (LFM 3), where `partial_rotary_factor` says how many pairs turn
      but the frequencies and the pairing are those of the whole head.
    - `use_attn_sinks`: each head has a learned logit `sinks[h]` that joins every query's
      softmax as one more key with no value, so a pattern row sums to less than one
      (GPT-OSS).
    - `attn_gate` ("sigmoid", Qwen3-Next; "softplus", Laguna): each head's `z` is
      multiplied by `gate(x @ W_G[h] + b_G[h])` of the attention's input before `W_O`
      reads it, one factor per dimension of the head, or one per head
      (`attn_gate_per_head`).
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
      it may differ only in latent attention; `d_value` is the width either way); the
      latents' RMSNorms have their own epsilon `latent_norm_eps`.
      `components.latent_attention`.
    - mixture of experts (`num_experts`, `experts_per_token`: TransformerLens's names): each MLP is
      a router choosing `experts_per_token` of `num_experts` experts of width `d_mlp` per token
      (gated as `gated_mlp` says, as are the shared expert and the dense MLPs beside them:
      Nemotron-H's are plain, `act(x @ W_in) @ W_out`), their outputs mixed by the router's softmax
      weights (over the chosen experts only when `norm_topk_prob`). `d_mlp_shared` adds an expert
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
    use_yarn_rope: bool = False
    yarn_factor: float = 1.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_original_ctx_len: int = 4096
    yarn_truncate: bool = True
    rotary_attention_factor: float = 1.0
    rotary_layers: tuple[bool, ...] | None = None
    alibi_slopes: tuple[float, ...] | None = None
    d_vocab_out: int | None = None
    n_key_value_heads: int | None = None
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    d_head_v: int | None = None
    latent_norm_eps: float = 1e-6
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
    attn_sub_norm: bool = False
    mlp_sub_norm: bool = False
    attn_scale: float | None = None
    attn_scores_soft_cap: float | None = None
    output_logits_soft_cap: float | None = None
    use_attn_sinks: bool = False
    differential_attention: bool = False
    attn_gate: str | None = None
    attn_gate_per_head: bool = False
    window_size: int | None = None
    attn_types: tuple[str, ...] | None = None
    window_chunked: bool = False
    query_temperature_floor: int | None = None
    query_temperature_scale: float = 0.1
    num_experts: int | None = None
    experts_per_token: int | None = None
    norm_topk_prob: bool = False
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
    mixers: MixerConfig | None = None
    eps: float = 1e-5
    use_attn_result: bool = False
    use_split_qkv_input: bool = False
    use_hook_mlp_in: bool = False
    use_attn_in: bool = False
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
        self._check_differential_attention()

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

    def _check_variants(self) -> None:
        """Check that the variants chosen fit together, in turn: the per-head inputs, the
        MLP, the norms, the experts and the per-layer lists; a ValueError names the clash."""
        if self.use_attn_in and self.use_split_qkv_input:
            raise ValueError(
                "use_attn_in and use_split_qkv_input are alternatives (one shared per-head "
                "input, or one per q/k/v); set at most one"
            )
        self._check_mlp_variants()
        self._check_norm_variants()
        if self.use_attn_in and self.n_key_value_heads not in (None, self.n_heads):
            raise ValueError(
                "use_attn_in gives every query head one input copy, which grouped keys and "
                "values cannot share; use use_split_qkv_input (one copy per key/value head)"
            )
        self._check_experts()
        self._check_layer_lists()
        self._check_llama4_variants()

    def _check_mlp_variants(self) -> None:
        """Check the MLP's variants: none asked of an attention-only model, a width for one
        with MLPs, and activations only in the MLP forms they have."""
        if self.attn_only:
            for flag in ("use_hook_mlp_in", "gated_mlp", "parallel_attn_mlp"):
                if getattr(self, flag):
                    raise ValueError(f"{flag}=True needs MLPs, but attn_only=True")
        elif self.d_mlp is None:
            raise ValueError(
                "d_mlp is required for a model with MLPs (attn_only=False); "
                "give d_mlp, e.g. 4 * d_model, or set attn_only=True"
            )
        if self.act_fn == "solu_ln" and self.has_mlp and (self.gated_mlp or self.is_moe):
            raise ValueError(
                "act_fn='solu_ln' normalises the neurons of a plain MLP; it has no gated "
                "(gated_mlp=True) or mixture-of-experts form: use another act_fn there"
            )
        if self.act_fn == "xielu" and self.has_mlp and self.is_moe:
            raise ValueError(
                "act_fn='xielu' keeps learned scalars in a dense MLP; it has no "
                "mixture-of-experts form: use another act_fn there"
            )

    def _check_sub_norms(self) -> None:
        """The sub-norms need norms, the attention's a plain one (not latent), the MLP's a
        gated dense MLP."""
        for field in ("attn_sub_norm", "mlp_sub_norm"):
            if getattr(self, field) and self.normalization_type is None:
                raise ValueError(f"{field}=True holds a norm, but normalization_type is None")
        if self.attn_sub_norm and self.kv_lora_rank is not None:
            raise ValueError("attn_sub_norm norms the heads' z of a plain attention: it needs "
                             f"kv_lora_rank=None (got {self.kv_lora_rank})")  # fmt: skip
        if self.mlp_sub_norm and (not self.gated_mlp or self.num_experts is not None):
            raise ValueError(
                "mlp_sub_norm norms a dense gated MLP's neurons: it needs gated_mlp=True and "
                f"num_experts=None (got {self.gated_mlp}, {self.num_experts})"
            )
        if self.mlp_gate_bias and (not self.gated_mlp or self.is_moe or self.mlp_sub_norm):
            raise ValueError(
                "mlp_gate_bias is the bias of a dense gated MLP's gate: it needs gated_mlp=True, "
                f"num_experts=None and mlp_sub_norm=False (got {self.gated_mlp}, "
                f"{self.num_experts}, {self.mlp_sub_norm})"
            )

    def _check_norm_variants(self) -> None:
        """Check the norms' variants: placements and embedding norms need norms, and each
        placement the block it norms."""
        if self.normalization_type is None and self.normalization_placement != "pre":
            raise ValueError(
                f"normalization_placement={self.normalization_placement!r} places norms, "
                f"but normalization_type is None (no norms)"
            )
        if self.embed_norm_before_positions and not (
            self.embed_norm and self.positional_embedding_type == "standard"
        ):
            raise ValueError(
                "embed_norm_before_positions=True norms the token embedding before learned "
                "positions are added: it needs embed_norm=True and "
                f"positional_embedding_type='standard', not {self.positional_embedding_type!r}"
            )
        self._check_embed_widths()
        flags = self.ln1_layers
        if flags is not None and (
            len(flags) != self.n_layers or not all(isinstance(f, bool) for f in flags)
        ):
            raise ValueError(
                f"ln1_layers must be {self.n_layers} booleans, one per block; got {flags}"
            )
        self._check_placement_layers()
        if self.normalization_type is None and (self.embed_norm or self.unembed_transform):
            raise ValueError(
                "embed_norm and unembed_transform each hold a norm, but normalization_type "
                "is None (no norms)"
            )
        self._check_sub_norms()
        if self.normalization_placement == "post_residual" and not self._is_sequential:
            raise ValueError(
                "normalization_placement='post_residual' norms the stream after each of a "
                "sequential block's two adds: it needs attn_only=False and "
                "parallel_attn_mlp=False"
            )

    def _check_placement_layers(self) -> None:
        """`placement_layers`: one placement per block, each of a block that norms its
        sublayers' inputs or writes (a post-residual block norms the stream, and the model
        then has no final norm: not a per-block choice)."""
        placements = self.placement_layers
        if placements is None:
            return
        valid = ("pre", "post", "pre_and_post")
        if len(placements) != self.n_layers or any(p not in valid for p in placements):
            raise ValueError(
                f"placement_layers must be {self.n_layers} placements, one per block, each "
                f"one of {valid}; got {placements}"
            )
        if self.normalization_type is None or self.normalization_placement == "post_residual":
            raise ValueError(
                "placement_layers places each block's norms: it needs normalization_type "
                f"set (got {self.normalization_type!r}) and normalization_placement not "
                f"'post_residual' (got {self.normalization_placement!r})"
            )

    def _check_embed_widths(self) -> None:
        """Check the widths on either side of the stream: a narrower embedding needs its
        positions in the stream, a narrower unembedding the head transform that maps to it."""
        if self.d_embed is not None and self.positional_embedding_type == "shortformer":
            raise ValueError(
                f"d_embed={self.d_embed} projects the embeddings into the stream, but "
                "positional_embedding_type='shortformer' adds W_pos to the queries' and "
                "keys' d_model-wide inputs: use 'standard', 'rotary' or 'none'"
            )
        if self.d_unembed is not None and self.unembed_transform is None:
            raise ValueError(
                f"d_unembed={self.d_unembed} is the width of the head transform's output, "
                "but unembed_transform is None (no head transform): name its activation"
            )

    def _check_layer_lists(self) -> None:
        """Check the per-layer lists (the hybrid's mixers, the attention types): one entry
        per layer, and a window for local attention."""
        if self.mixers is not None and len(self.mixers.layers) != self.n_layers:
            raise ValueError(
                f"mixers.layers has {len(self.mixers.layers)} entries but n_layers="
                f"{self.n_layers}: give one sublayer kind per layer"
            )
        self._check_hybrid_layouts()
        if self.attn_types is not None:
            if self.window_size is None:
                raise ValueError("attn_types with 'local' layers needs window_size")
            if len(self.attn_types) != self.n_layers:
                raise ValueError(
                    f"attn_types has {len(self.attn_types)} entries but n_layers="
                    f"{self.n_layers}: give one 'global' or 'local' per layer"
                )

    def _check_llama4_variants(self) -> None:
        """The per-block q/k norms, the chunked window and the query temperature each need
        what they modify: q/k norms, a window, positions other than learned ones."""
        flags = self.qk_norm_layers
        if flags is not None and not self.use_qk_norm:
            raise ValueError("qk_norm_layers says which blocks norm queries and keys: it "
                             "needs use_qk_norm=True")  # fmt: skip
        if flags is not None and (
            len(flags) != self.n_layers or not all(isinstance(f, bool) for f in flags)
        ):
            raise ValueError(
                f"qk_norm_layers must be {self.n_layers} booleans, one per block; got {flags}"
            )
        if self.window_chunked and self.window_size is None:
            raise ValueError("window_chunked cuts the window into chunks: give window_size")
        temperature = self.query_temperature_floor
        if temperature is not None and self.positional_embedding_type not in ("rotary", "none"):
            raise ValueError(
                f"query_temperature_floor={temperature} scales the queries of blocks without "
                "rotary positions: it needs positional_embedding_type 'rotary' or 'none', "
                f"not {self.positional_embedding_type!r}"
            )

    def _check_hybrid_layouts(self) -> None:
        """The blocks a hybrid's layout asks for exist: blocks of one sublayer (Nemotron-H)
        and a mixer beside attention (Falcon-H1) need a sequential block."""
        if self.mixers is None:
            return
        if self.mixers.mlp_layers is not None and self.attn_only:
            raise ValueError(
                "mixers.mlp_layers says which blocks hold an MLP: it needs attn_only=False"
            )
        one_sublayer = "none" in self.mixers.layers or self.mixers.mlp_layers is not None
        if one_sublayer and not (
            self._is_sequential and self.normalization_placement != "post_residual"
        ):
            raise ValueError(
                "blocks of one sublayer (mixers.layers 'none', mixers.mlp_layers) need a "
                "sequential block with norms before or after each sublayer: attn_only=False, "
                "parallel_attn_mlp=False, normalization_placement not 'post_residual'"
            )
        if self.mixers.beside_attention is not None and not (
            self._is_sequential and self.normalization_placement == "pre"
        ):
            raise ValueError(
                "mixers.beside_attention (a mixer beside the attention, Falcon-H1's block) "
                "needs a sequential block with pre-norms: attn_only=False, "
                "parallel_attn_mlp=False, normalization_placement='pre' (got "
                f"{self.attn_only}, {self.parallel_attn_mlp}, {self.normalization_placement!r})"
            )

    def _check_experts(self) -> None:
        moe_fields = ("norm_topk_prob", "d_mlp_shared", "shared_expert_gate", "swiglu_limit",
                      "n_dense_layers", "moe_layers", "d_mlp_dense", "moe_out_norm",
                      "expert_input_weighted")  # fmt: skip
        routing = dict(router_scoring="softmax", n_expert_groups=1, topk_expert_groups=1,
                       group_score_experts=2, routed_scaling_factor=1.0,
                       sparsemixer_jitter_eps=0.01)  # fmt: skip
        if self.num_experts is None:
            if self.experts_per_token is not None:
                raise ValueError("experts_per_token needs num_experts (the experts to choose from)")
            for field in moe_fields:
                if getattr(self, field) not in (None, False, 0):
                    raise ValueError(f"{field} is a mixture-of-experts setting: give num_experts")
            for field, default in routing.items():
                if getattr(self, field) != default:
                    raise ValueError(f"{field} is a mixture-of-experts setting: give num_experts")
            return
        if self.experts_per_token is None:
            raise ValueError("num_experts needs experts_per_token (how many each token uses)")
        if self.experts_per_token > self.num_experts:
            raise ValueError(
                f"experts_per_token={self.experts_per_token} exceeds num_experts="
                f"{self.num_experts}: a token chooses among the experts there are"
            )
        self._check_routing()
        if self.attn_only:
            raise ValueError(
                "a mixture of experts replaces a block's MLP: it needs attn_only=False"
            )
        if self.swiglu_limit is not None and not self.gated_mlp:
            raise ValueError(
                f"swiglu_limit={self.swiglu_limit} clamps a gated expert's SwiGLU: it needs "
                "gated_mlp=True (plain experts have no gate to clamp)"
            )
        if self.shared_expert_gate and self.d_mlp_shared is None:
            raise ValueError("shared_expert_gate gates a shared expert: give d_mlp_shared")
        if self.moe_out_norm and (self.normalization_type is None or self.placements != ("pre",)):
            raise ValueError(
                "moe_out_norm norms the mixture's output as the blocks' ln2_post: it needs a "
                "normalization_type (one of LN, LNPre, RMS, RMSPre) and every block placed "
                f"'pre' (got {self.normalization_type!r}, placements {self.placements})"
            )
        self._check_moe_layers()

    def _check_moe_layers(self) -> None:
        """`moe_layers`: a flag per block, some block with experts, a dense width for the
        blocks without; never beside `n_dense_layers` (one place says which blocks)."""
        flags = self.moe_layers
        if flags is None:
            return
        if len(flags) != self.n_layers or not all(isinstance(f, bool) for f in flags):
            raise ValueError(
                f"moe_layers must be {self.n_layers} booleans, one per block; got {flags}"
            )
        if self.n_dense_layers:
            raise ValueError(
                f"n_dense_layers={self.n_dense_layers} and moe_layers={flags} both say which "
                "blocks hold experts: give moe_layers alone"
            )
        if not any(flags):
            raise ValueError(
                f"moe_layers={flags} has no block with experts: leave num_experts unset"
            )
        if not all(flags) and self.d_mlp_dense is None:
            raise ValueError(
                f"moe_layers={flags} keeps dense MLPs in some blocks: give d_mlp_dense"
            )

    def _check_routing(self) -> None:
        groups, best = self.n_expert_groups, self.topk_expert_groups
        if self.router_scoring != "sparsemixer" and self.sparsemixer_jitter_eps != 0.01:
            raise ValueError(
                f"sparsemixer_jitter_eps={self.sparsemixer_jitter_eps} is the sparsemixer's: "
                f"router_scoring={self.router_scoring!r} does not read it"
            )
        if self.num_experts % groups or best > groups:
            raise ValueError(
                f"n_expert_groups={groups} must divide num_experts={self.num_experts}, and "
                f"topk_expert_groups={best} be at most n_expert_groups"
            )
        if groups > 1 and self.num_experts // groups < self.group_score_experts:
            raise ValueError(
                f"n_expert_groups={groups} leaves {self.num_experts // groups} experts per "
                f"group; a group's score is the sum of its group_score_experts="
                f"{self.group_score_experts} best experts'"
            )
        if best * (self.num_experts // groups) < self.experts_per_token:
            raise ValueError(
                f"topk_expert_groups={best} groups of {self.num_experts // groups} experts "
                f"hold fewer than experts_per_token={self.experts_per_token}"
            )
        if self.n_dense_layers and self.d_mlp_dense is None:
            raise ValueError(
                "n_dense_layers keeps dense MLPs in the first blocks: give d_mlp_dense"
            )
        if self.n_dense_layers > self.n_layers:
            raise ValueError(
                f"n_dense_layers={self.n_dense_layers} exceeds n_layers={self.n_layers}"
            )

    def _check_differential_attention(self) -> None:
        """Differential attention pairs the query heads and splits the key/value heads in
        two halves (`components.differential_attention`); it has no sinks, gate, sub-norm,
        latent or value width of its own."""
        if not self.differential_attention:
            return
        if self.n_heads % 2 or self.n_kv_heads % 2:
            raise ValueError(
                f"differential_attention pairs the query heads and halves the key/value "
                f"heads: it needs both even (got n_heads={self.n_heads}, "
                f"n_key_value_heads={self.n_kv_heads})"
            )
        refused = [f"{field}={getattr(self, field)!r}"
                   for field in ("use_attn_sinks", "attn_gate", "attn_sub_norm", "kv_lora_rank",
                                 "d_head_v") if getattr(self, field)]  # fmt: skip
        if refused:
            raise ValueError(f"differential_attention cannot go with {', '.join(refused)}")

    def _check_latent_attention(self) -> None:
        if self.kv_lora_rank is None:
            if self.q_lora_rank is not None:
                raise ValueError("q_lora_rank is a latent attention setting: give kv_lora_rank")
            if self.d_head_v not in (None, self.d_head):
                raise ValueError(
                    f"d_head_v={self.d_head_v} differs from d_head={self.d_head}, which only "
                    f"latent attention (kv_lora_rank) computes"
                )
            return
        refused = [
            f"{field}={getattr(self, field)!r}"
            for field, plain in (
                ("positional_embedding_type", "rotary"), ("n_key_value_heads", None),
                ("use_split_qkv_input", False), ("use_attn_in", False),
                ("use_qk_norm", False), ("use_attn_sinks", False), ("attn_gate", None),
            )
            if getattr(self, field) != plain
        ]  # fmt: skip
        if refused:
            raise ValueError(
                f"latent attention (kv_lora_rank={self.kv_lora_rank}) is built with rotary "
                f"positions, one key/value head per query head and one shared input; these "
                f"settings cannot go with it: {', '.join(refused)}"
            )
        if self.rotary_dim >= self.d_head:
            raise ValueError(
                f"rotary_dim={self.rotary_dim} must be below d_head={self.d_head}: in latent "
                f"attention the rotated part ends each query/key head, after its unrotated part"
            )

    def _check_rotary(self) -> None:
        if self.rotary_layers is not None:
            flags = self.rotary_layers
            if self.positional_embedding_type != "rotary":
                raise ValueError(
                    "rotary_layers is set, but positional_embedding_type is not "
                    f"'rotary' (it is {self.positional_embedding_type!r})"
                )
            if len(flags) != self.n_layers or not all(isinstance(f, bool) for f in flags):
                raise ValueError(
                    f"rotary_layers must be {self.n_layers} booleans, one per block; got {flags}"
                )
        if self.positional_embedding_type != "rotary":
            return
        if self.rotary_dim % 2 or not 0 < self.rotary_dim <= self.d_head:
            raise ValueError(
                f"rotary_dim must be even and in 2..d_head={self.d_head}, got {self.rotary_dim}"
            )
        if self.use_NTK_by_parts_rope and self.use_yarn_rope:
            raise ValueError("use_NTK_by_parts_rope and use_yarn_rope are alternatives")
        if self.rotary_pairs is not None and self.rotary_pairs > self.rotary_dim // 2:
            raise ValueError(
                f"rotary_pairs={self.rotary_pairs} exceeds the {self.rotary_dim // 2} pairs of "
                f"rotary_dim={self.rotary_dim}"
            )
        if self.use_NTK_by_parts_rope and not (
            self.NTK_by_parts_low_freq_factor < self.NTK_by_parts_high_freq_factor
        ):
            raise ValueError(
                f"NTK_by_parts_low_freq_factor={self.NTK_by_parts_low_freq_factor} must be "
                f"below NTK_by_parts_high_freq_factor={self.NTK_by_parts_high_freq_factor}"
            )

    def _check_alibi(self) -> None:
        slopes = self.alibi_slopes
        if self.positional_embedding_type != "alibi":
            if slopes is not None:
                raise ValueError(
                    "alibi_slopes is set, but positional_embedding_type is not 'alibi' (it "
                    f"is {self.positional_embedding_type!r})"
                )
            return
        if slopes is not None and (
            len(slopes) != self.n_heads
            or not all(isinstance(s, int | float) and not isinstance(s, bool) for s in slopes)
        ):
            raise ValueError(
                f"alibi_slopes must be {self.n_heads} numbers, one per head; got {slopes}"
            )
        if self.attn_scores_soft_cap is not None:
            raise ValueError(
                "positional_embedding_type='alibi' with attn_scores_soft_cap: no model caps "
                "biased scores, and where the bias goes relative to the cap is not defined"
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

    def layer_is_moe(self, layer: int) -> bool:
        """Whether block `layer`'s MLP is a mixture of experts: its flag in `moe_layers`, or
        past the `n_dense_layers` dense first ones; the one place that decides."""
        if not self.is_moe:
            return False
        if self.moe_layers is not None:
            return self.moe_layers[layer]
        return layer >= self.n_dense_layers

    @property
    def n_kv_heads(self) -> int:
        """Key/value heads per layer: `n_key_value_heads`, or `n_heads` without grouping."""
        return self.n_heads if self.n_key_value_heads is None else self.n_key_value_heads

    @property
    def use_normalization_before_and_after(self) -> bool:
        """TransformerLens's name for `normalization_placement == "pre_and_post"`."""
        return self.normalization_placement == "pre_and_post"

    def layer_has_mlp(self, layer: int) -> bool:
        """Whether block `layer` holds an MLP (`has_mlp`, and a hybrid's `mlp_layers`)."""
        return self.has_mlp and (self.mixers is None or self.mixers.holds_mlp(layer))

    def layer_mixer(self, layer: int) -> str:
        """The sublayer that mixes positions in block `layer`: "attention", or another
        kind of `mixer_config.MIXER_KINDS` in a hybrid model (`mixers`)."""
        return "attention" if self.mixers is None else self.mixers.layers[layer]

    def require_attention(self, what: str, layers: Any = None) -> None:
        """A ValueError naming the blocks (of `layers`; None: all) whose sublayer is not
        attention, for `what`, which needs heads there."""
        layers = range(self.n_layers) if layers is None else layers
        others = {layer: self.layer_mixer(layer) for layer in layers}
        others = {layer: kind for layer, kind in others.items() if kind != "attention"}
        if others:
            raise ValueError(
                f"{what} needs attention heads, but in this hybrid model blocks "
                f"{sorted(others)} hold {sorted(set(others.values()))} in attention's place "
                f"(a mixer's write is blocks.L.hook_attn_out, its internals blocks.L.mixer.*; "
                f"'none': the block mixes no positions, an MLP alone)"
            )

    def layer_norms_attn_input(self, layer: int) -> bool:
        """Whether block `layer` has its pre-norm `ln1` (`ln1_layers`) where the placement
        puts one."""
        return self.ln1_layers is None or self.ln1_layers[layer]

    def layer_placement(self, layer: int) -> str:
        """Where block `layer`'s norms sit: its `placement_layers` entry, else
        `normalization_placement`."""
        if self.placement_layers is None:
            return self.normalization_placement
        return self.placement_layers[layer]

    @property
    def placements(self) -> tuple[str, ...]:
        """The blocks' norm placements, each once, in block order (`layer_placement`)."""
        if self.placement_layers is None:
            return (self.normalization_placement,)
        return tuple(dict.fromkeys(self.placement_layers))

    def layer_rotates(self, layer: int) -> bool:
        """Whether block `layer` rotates its queries and keys (`rotary_layers`)."""
        if self.positional_embedding_type != "rotary":
            return False
        return self.rotary_layers is None or self.rotary_layers[layer]

    def layer_norms_qk(self, layer: int) -> bool:
        """Whether block `layer` norms its queries and keys (`use_qk_norm`,
        `qk_norm_layers`)."""
        if not self.use_qk_norm:
            return False
        return self.qk_norm_layers is None or self.qk_norm_layers[layer]

    def layer_tunes_queries(self, layer: int) -> bool:
        """Whether block `layer` scales its queries by position (`query_temperature_floor`:
        the blocks that do not rotate)."""
        return self.query_temperature_floor is not None and not self.layer_rotates(layer)

    def layer_attn_type(self, layer: int) -> str:
        """ "local" (windowed) or "global" attention in block `layer`."""
        if self.window_size is None:
            return "global"
        return "local" if self.attn_types is None else self.attn_types[layer]

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
