"""What the importer by convention recognised in an architecture: the `Anatomy` record.

`_anatomy` fills it by watching a checkpoint's tiny twin run (and `_split_layers`,
`_mixers` the parts of it their layouts need); `_convention` turns it into our config and a
weight table; the memo (`_verify`'s "anatomies") keeps it as JSON, read back by
`from_json`. Every field added since the first has a default, so older memo entries load.
"""

import dataclasses
from typing import Any

from hookedattn.core.hf import _mixers
from hookedattn.core.hf._experts import Experts
from hookedattn.core.hf._mixers import Mixers
from hookedattn.core.hf._probes import Scale

# A softmax scale the attention does not keep: the candidates try the usual ones.
UNKNOWN = Scale("unknown", "")


@dataclasses.dataclass(frozen=True)
class Anatomy:
    """What `recognise` found: names relative to the model (`layers`, `embed`, ...) or to a
    decoder layer (`attn`, `mlp`, norms), and the kinds and scalars above."""

    architecture: str
    layers: str  # "model.layers"
    base: str  # "model." (the base model's prefix; "" when there is none)
    embed: str  # "model.embed_tokens"
    final_norm: str  # "model.norm"
    unembed: str  # "lm_head"
    attn: str  # "self_attn"
    mlp: str  # "mlp"; "" where the MLP's maps are the layer's own (`fc1`, `fc2`)
    norms: tuple[tuple[str, str], ...]  # (ours, the layer's child), e.g. ("ln1", "input_layernorm")
    placement: str  # "pre", "post" or "pre_and_post"
    parallel: bool
    norm_kind: str  # one of `_probes.NORM_KINDS`, every norm of the model
    norm_bias: bool
    eps: float
    attn_maps: tuple[tuple[str, str, bool], ...]  # (role, name, has bias)
    qk_norm: str | None  # None, "per_head" or "whole"
    qk_norm_names: tuple[str, str] | None
    mlp_maps: tuple[tuple[str, str, bool], ...]
    act_fn: str
    embed_scale: Scale
    attn_scale: Scale  # the softmax's: scores are multiplied by it
    attn_write: Scale  # what the attention's write is multiplied by before it is added
    mlp_write: Scale
    logit_scale: Scale
    rotary: bool
    tied: bool
    unembed_bias: bool
    sinks: bool  # one learned logit per head in every softmax (`use_attn_sinks`)
    positions: str | None  # the learned absolute positions' table ("model.embed_positions")
    position_offset: int  # the row of position 0 in it
    unused: tuple[str, ...]  # a layer's pieces a causal LM never calls (cross-attention)
    experts: Experts | None  # the MLP is a mixture of experts (`_experts`)
    renames: tuple[tuple[str, str], ...]  # (live name, the files' name) where they differ
    logit_cap: bool  # the logits soft-capped by the config's `final_logit_softcapping`
    # "halves" (i, i + d/2), "pairs" (2i, 2i + 1), or "halves_reversed" (halves, by -angle)
    rotary_layout: str = "halves"
    # Which layers rotate: "all", or "sliding" (only the windowed ones: Cohere 2, EXAONE 4).
    rotary_on: str = "all"
    norm_topk: bool = False  # a mixture's routing weights renormalised over the chosen
    # How a mixture's router scores experts (`HookedTransformerConfig.router_scoring`).
    router_scoring: str = "softmax"
    # An output gate on each head's z (`HookedTransformerConfig.attn_gate`): its function
    # (a candidate: "sigmoid" or "softplus"; None without a gate) and width.
    attn_gate: str | None = None
    attn_gate_per_head: bool | None = None  # None: no gate
    qk_norm_after_rotary: bool = False  # a candidate: HunYuan normalises rotated q, k
    # The scores soft-capped by the config's `attn_logit_softcapping` (a candidate where it
    # is set: HF's Gemma 3 keeps the field but never applies it).
    attn_soft_cap: bool = True
    # The q/k norms hold no gain (Llama 4's: read as ones), and which layers hold them:
    # "all", or "rotating" (Llama 4's, as `no_rope_layers` says): `_qk_layers`.
    qk_norm_bare: bool = False
    qk_norm_on: str = "all"
    # A fused q/k/v map's rows: "stacked" [q; k; v], "per_head" [q_h; k_h; v_h] for each
    # head h (GPT-NeoX's, Persimmon's), or "sharded", 4 shards of [q; v; k], each a quarter
    # of the heads (CodeGen's `mp_num`): a candidate.
    qkv_layout: str = "stacked"
    # Multi-head latent attention under DeepSeek's names (`kv_a_proj_with_mqa`, ...): its
    # maps are read as `_deepseek` reads them; `attn_maps` is then empty.
    latent: bool = False
    # BERT-likes (`_split_layers`) and BART-likes: the norm of the embeddings, the
    # token-type table whose row 0 every token gets (folded into the positions), whether
    # the positions' offset rows count in `max_position_embeddings` (RoBERTa's), and the
    # head transform before the decoder (its dense map, norm and activation).
    embed_norm: str | None = None
    token_types: str | None = None
    positions_within: bool = False
    # Fixed sinusoidal positions (a buffer, in no checkpoint): which table (`_sinusoids`).
    positions_fixed: str | None = None
    # The table of sinusoids handed to every layer to rotate by (`_handed_rotary`,
    # RoFormer's): a weight its checkpoints save, our rotary computing it.
    rotary_table: str | None = None
    # Rows of the embedding past `vocab_size` (Mllama's 8 for image tokens): never an
    # output, read into `W_E` all the same.
    embed_rows_extra: int = 0
    # A bias of the attention's output only the last layer keeps, as a parameter of its
    # attention (GPT-NeoX Japanese's `dense_bias`): that layer's `b_O`.
    last_layer_o_bias: str | None = None
    # The embeddings' norm reads the token embedding alone, the positions added after it.
    embed_norm_before_positions: bool = False
    # Modules outside the layers that a forward on tokens alone never calls (Phi-4-
    # multimodal's image and audio encoders): their tensors are left out of the import.
    uncalled: tuple[str, ...] = ()
    head_dense: str | None = None
    head_dense_bias: bool = True  # ModernBERT-decoder's has none
    head_norm: str | None = None
    head_act: str | None = None
    # Embeddings of another width than the stream (`_projections`): the linear map into the
    # stream, whether it has a bias, and the config fields naming the embeddings' width and
    # the head's (None: the stream's).
    embed_proj: str | None = None
    embed_proj_bias: bool = True
    embed_width: str | None = None
    head_width: str | None = None
    # A hybrid's mixers in attention's place in some layers (`_mixers`); the attention, its
    # norms and wiring are then read off the first layer that attends.
    mixers: Mixers | None = None
    # The mixer layers' norms where they differ from the attention layers' `norms`
    # (`_mixer_norms`: OLMo Hybrid's pre-norms beside its attention's post-norms).
    mixer_norms: tuple[tuple[str, str], ...] | None = None
    # ALiBi: the attention is handed a linear bias per head (`_alibi`), no positions else.
    alibi: bool = False
    # The first layer's children that are the identity where the others hold a norm
    # (ModernBERT-decoder's `attn_norm`: `_first_layer`).
    first_identities: tuple[str, ...] = ()
    # Norms inside a sublayer (BitNet's, `_sub_norms`): of the heads' z before the output
    # map, of the MLP's neurons before its down map; their names in the attention, the MLP.
    attn_sub_norm: str | None = None
    mlp_sub_norm: str | None = None

    def role(self, maps: tuple[tuple[str, str, bool], ...], role: str) -> tuple[str, bool] | None:
        """The name of the linear map with `role` and whether it has a bias; None if none."""
        return next(((name, bias) for r, name, bias in maps if r == role), None)


def from_json(fields: dict[str, Any]) -> Anatomy:
    """An anatomy as `recognise` stored it (`dataclasses.asdict`: lists for tuples)."""

    def tupled(x: Any) -> Any:
        return tuple(tupled(i) for i in x) if isinstance(x, list) else x

    def value(key: str, v: Any) -> Any:
        if key == "renames":
            return tuple(tuple(pair) for pair in v)
        if key == "experts":
            return None if v is None else Experts(**{k: tupled(x) for k, x in v.items()})
        if key == "mixers":
            return None if v is None else _mixers.from_json(v)
        return Scale(**v) if isinstance(v, dict) else tupled(v)

    return Anatomy(**{k: value(k, v) for k, v in fields.items()})
