"""A checkpoint's tiny twin: its architecture and every structural option of its config, with
few layers, small widths and random weights.

`tiny_config` shrinks a `transformers` config field by field, by the field's name (the
names `transformers`' configs use for one thing differ: `hidden_size`, `n_embd`, `d_model`):

    widths        d_model 64, 4 heads, MLP 128, an expert's MLP 32, a shared expert's 48,
                  vocabulary 128 (token ids past it moved inside), MLA ranks 32
    kept as kinds grouped keys and values (1 KV head stays 1, fewer than the heads become
                  2), a head width differing from d_model / heads (then 32, else 16; MLA's
                  the rotated part's), a partial rotary width (scaled with the head), a
                  projection around the stream; any other width equal to d_model follows it
    counts        experts at most 4, routed per token at most 2, shared experts at most 1
    windows       every window and attention chunk 4 tokens, shorter than the twin's input
    layers        every per-layer list (`layer_types`, `mlp_layer_types`, ...), list of
                  layer indices (`mlp_only_layers`) and per-layer settings map cut to the
                  shortest prefix holding each of its kinds (at least 2 layers; where that
                  is over 8, each run of equal layers kept once), and renumbered; the
                  layers reading earlier layers' keys and values (`num_kv_shared_layers`)
                  shrunk apart, after those (one per run, at most 2)

Everything else (norms and their epsilons, activations, rotary bases and scalings, soft
caps, biases, tied embeddings, which layers are dense) is the config's own; a head width
or key/value head count the config leaves unset is set to what it would be derived as.
`OVERRIDES` holds, per model type, the fields the generic shrink gets wrong (the sweep
`scripts/coverage.py` finds them).

`random_hf_model` builds one with eager attention and random weights drawn so that a
forgotten piece shows: every matrix ~ N(0, 1/fan_in), every vector (norm gains, biases)
moved from its initial value by N(0, 0.2²), and every embedding ~ N(0, 1e-6) so that the
stream entering the first norm is as small as its epsilon, which therefore moves the
output (a wrong epsilon shows). Frozen embedding tables (sinusoids computed at construction,
never trained: RoFormer's rotary angles) are kept as computed.
"""

import contextlib
import math
from collections.abc import Callable
from typing import Any

import torch

WIDTH, HEADS, MLP, EXPERT_MLP, SHARED_MLP, VOCAB, WINDOW = 64, 4, 128, 32, 48, 128, 4
MAX_LAYERS = 8
_EMBEDDING_STD, _VECTOR_STD = 1e-3, 0.2
# Embeddings (and a head's output) of another width than the stream's, projected to it: each
# side its own twin width, none of them another size's, so that no two are confused.
_EMBEDDING_WIDTHS = {"embedding_size": 40, "input_embedding_size": 40, "output_embedding_size": 24}

# A field's name -> its twin's value, wherever a config sets it (an int, or a per-layer list
# of ints).
_SIZES: dict[str, int] = {
    **dict.fromkeys(("hidden_size", "n_embd", "d_model", "n_embed", "embed_dim", "emb_dim"), WIDTH),
    **dict.fromkeys(
        ("num_attention_heads", "n_head", "num_heads", "n_heads", "decoder_attention_heads",
         "encoder_attention_heads", "swa_num_attention_heads", "linear_num_value_heads",
         "linear_num_heads", "index_n_heads", "num_attention_heads_per_layer"),
        HEADS,
    ),
    **dict.fromkeys(
        ("intermediate_size", "n_inner", "ffn_dim", "decoder_ffn_dim", "encoder_ffn_dim",
         "d_ff", "ffn_hidden_size", "dim_ff", "dff"),
        MLP,
    ),
    **dict.fromkeys(("moe_intermediate_size", "expert_intermediate_size"), EXPERT_MLP),
    **dict.fromkeys(
        ("shared_expert_intermediate_size", "shared_intermediate_size",
         "shared_experts_intermediate_size", "first_dense_intermediate_size",
         "moe_shared_expert_intermediate_size"),
        SHARED_MLP,
    ),
    **dict.fromkeys(("vocab_size", "vocab_size_per_layer_input"), VOCAB),
    # Multi-head latent attention (DeepSeek): low-rank q and kv, a rotary part of the head.
    **dict.fromkeys(("q_lora_rank", "kv_lora_rank"), 32),
    "qk_rope_head_dim": 8, "qk_nope_head_dim": 16, "v_head_dim": 16, "qk_head_dim": 24,
    # Linear attention and state-space layers of the hybrids.
    **dict.fromkeys(
        ("linear_key_head_dim", "linear_value_head_dim", "linear_head_dim", "index_head_dim",
         "swa_head_dim", "mamba_d_head", "kv_channels"),
        16,
    ),
    **dict.fromkeys(("mamba_d_state", "state_size", "ssm_state_size"), 16),
    **dict.fromkeys(("linear_num_key_heads", "swa_num_key_value_heads"), 2),
    **dict.fromkeys(("time_step_rank", "mamba_dt_rank"), 8),
    "hidden_size_per_layer_input": 16,
    "laurel_rank": 8,
}  # fmt: skip
# A count -> the most its twin keeps (a smaller one is kept).
_AT_MOST: dict[str, int] = {
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(
        ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k_experts", "moe_k",
         "index_topk"),
        2,
    ),
    **dict.fromkeys(("n_shared_experts", "num_shared_experts", "moe_num_shared_experts"), 1),
    **dict.fromkeys(("n_group", "topk_group", "num_expert_group", "n_groups", "mamba_n_groups",
                     "mamba_ngroups"), 1),
    "index_num_heads": 2,
    **dict.fromkeys(("first_k_dense_replace", "num_dense_layers"), 1),
    **dict.fromkeys(
        ("sliding_window", "window_size", "attention_window", "sliding_window_size",
         "attention_chunk_size", "local_attention_window_len"),
        WINDOW,
    ),
}  # fmt: skip
_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "decoder_layers")
_HEADS = ("num_attention_heads", "n_head", "num_heads", "n_heads", "decoder_attention_heads")
_KV_HEADS = ("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num")
_WIDTHS = ("hidden_size", "n_embd", "d_model", "n_embed", "embed_dim", "emb_dim")
_HEAD_DIMS = ("head_dim", "d_head", "attention_head_dim", "dim_head")
# Lists of layer indices (not one entry per layer), and maps from a layer's index to its
# settings: renumbered for the layers the twin keeps.
_LAYER_INDICES = ("mlp_only_layers", "attn_layer_indices", "local_layer_ids", "index_layers")
_LAYER_MAPS = ("per_layer_config",)
# A layer kind every `period`-th layer from `offset`.
_PERIODS = (
    ("attn_layer_period", "attn_layer_offset"),
    ("expert_layer_period", "expert_layer_offset"),
)
# Fields never read as per-layer lists, whatever their length.
_NOT_PER_LAYER = ("architectures", "eos_token_id", "bad_words_ids", "suppress_tokens")

# Per model type, the fields the generic shrink gets wrong, or that the config class's
# defaults leave unset (set after the shrink).
_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
OVERRIDES: dict[str, dict[str, Any]] = {
    "bamba": {"attn_layer_indices": [1]},  # by default no layer attends
    "cohere_compass_text": {
        "rope_parameters": {"full_attention": _ROPE, "sliding_attention": _ROPE}
    },
    "deepseek_v2": {"num_experts_per_tok": 2},
    "dots1": {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1},
    "dots3_note_text": {"head_dim": 24},  # its windowed layers: the MLA head, 16 + 8
    # Its muP multipliers are all 1 by default: a multiplier not folded would not show.
    "falcon_h1": {
        "embedding_multiplier": 1.7, "lm_head_multiplier": 0.6, "attention_in_multiplier": 0.8,
        "attention_out_multiplier": 1.3, "key_multiplier": 0.7, "ssm_in_multiplier": 1.2,
        "ssm_out_multiplier": 0.9, "ssm_multipliers": [0.5, 1.5, 0.8, 1.1, 0.7],
        "mlp_multipliers": [1.4, 0.75],
    },
    "gemma3n_text": {  # the last layers reuse the keys and values of earlier ones
        "num_hidden_layers": 10, "num_kv_shared_layers": 5, "intermediate_size": [MLP] * 10,
        "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 2,
        "activation_sparsity_pattern": [0.0] * 10,
    },
    "granitemoehybrid": {"layer_types": ["linear_attention", "attention"]},
    "hrm_text": {"num_layers_per_stack": 1},
    "lfm2_moe": {"num_hidden_layers": 3, "num_dense_layers": 1,
                 "layer_types": ["conv", "full_attention", "conv"]},
    # Its query temperature steps up every `floor_scale` positions (8192): every 4 here, and
    # its dense MLPs (every layer holds experts by default) every other layer.
    "llama4_text": {"floor_scale": 4, "moe_layers": [1, 3, 5, 7], "intermediate_size_mlp": 96},
    "mamba2": {"num_heads": 4, "head_dim": 32},
    # Its audio encoder (24 conformer blocks, 1,024 channels: 10.9M parameters on a twin),
    # which a forward on tokens never calls, in one small block.
    "phi4_multimodal": {"audio_config": {
        "hidden_size": WIDTH, "intermediate_size": MLP, "num_attention_heads": HEADS,
        "num_blocks": 1, "nemo_conv_channels": 32, "ext_pw_out_channel": WIDTH,
        "depthwise_separable_out_channel": WIDTH,
    }},
    "recurrent_gemma": {"num_hidden_layers": 3},  # its block types cycle over 3 layers
    "reformer": {"is_decoder": True, "axial_pos_embds_dim": [32, 32]},
}  # fmt: skip


def tiny_config(config: Any) -> Any:
    """The twin of `config` (a `transformers` config): its own class, built from its own
    fields with the sizes shrunk (module docstring)."""
    fields = shrunk(config.to_dict())
    fields |= OVERRIDES.get(config.model_type, {})
    twin = type(config).from_dict(fields)
    # A head width or key/value head count left unset, where the model reads it as set.
    for name, value in (("head_dim", WIDTH // HEADS), ("num_key_value_heads", HEADS)):
        if name in fields and fields[name] is not None:
            continue
        with contextlib.suppress(Exception):  # a per-layer field refuses a global read
            if getattr(twin, name, 0) is None:
                setattr(twin, name, value)
    return twin


def shrunk(fields: dict[str, Any]) -> dict[str, Any]:
    """A config's fields (`to_dict()`), shrunk; sub-configs (`text_config`, ...) too."""
    out = {
        k: shrunk(v) if k.endswith("_config") and isinstance(v, dict) else v
        for k, v in fields.items()
    }
    layers = _int(fields, _LAYERS)
    out |= _shrunk_layers(fields, layers) if layers else {}
    out |= _shrunk_heads(fields)
    for name, value in fields.items():
        if name in _SIZES and _is_int(value):
            out[name] = _SIZES[name]
        elif name in _SIZES and isinstance(out[name], list) and all(map(_is_int, out[name])):
            out[name] = [_SIZES[name]] * len(out[name])  # a size per layer
        elif name in _AT_MOST and _is_int(value):
            out[name] = min(value, _AT_MOST[name])
    out |= _token_ids(fields, out.get("vocab_size"))
    if "dtype" in out:
        out["dtype"] = "float32"
    return out


def _shrunk_layers(fields: dict[str, Any], layers: int) -> dict[str, Any]:
    """The layer count and everything per layer: lists with an entry per layer, lists of
    layer indices, maps from layer index to settings. The layers kept are the shortest
    prefix holding each kind of each of them (at least 2); where that is over
    `MAX_LAYERS`, one layer per run of equal layers."""
    lists = {
        k: v
        for k, v in fields.items()
        if isinstance(v, list) and len(v) == layers and layers > 2 and k not in _NOT_PER_LAYER
    }
    indices = {k: set(fields[k]) for k in _LAYER_INDICES if isinstance(fields.get(k), list)}
    maps = {
        k: {int(i): v for i, v in fields[k].items()}
        for k in _LAYER_MAPS
        if isinstance(fields.get(k), dict)
    }
    columns = [
        *lists.values(),
        *([i in chosen for i in range(layers)] for chosen in indices.values()),
        *([repr(m.get(i)) for i in range(layers)] for m in maps.values()),
    ]
    shared = fields.get("num_kv_shared_layers")
    sharing = _is_int(shared) and 0 < shared < layers
    keep = _kept_sharing(columns, layers, shared) if sharing else _kept(columns, layers)
    n = len(keep)
    out: dict[str, Any] = {k: n for k in _LAYERS if _is_int(fields.get(k))}
    if sharing:
        out["num_kv_shared_layers"] = sum(i >= layers - shared for i in keep)
    out |= {k: [v[i] for i in keep] for k, v in lists.items()}
    out |= {k: [j for j, i in enumerate(keep) if i in chosen] for k, chosen in indices.items()}
    out |= {
        k: {str(j): _shrunk_setting(m[i], fields) for j, i in enumerate(keep) if i in m}
        for k, m in maps.items()
    }
    if _is_int(fields.get("encoder_layers")):
        out["encoder_layers"] = 2
    if _is_int(fields.get("max_window_layers")):  # Qwen 2: the window starts at this layer
        out["max_window_layers"] = n if fields["max_window_layers"] >= layers else 1
    for period, offset in _PERIODS:  # every `period`-th layer from `offset` (Jamba)
        if _is_int(fields.get(period)) and fields[period] > 2:
            out[period] = 2
            if _is_int(fields.get(offset)):
                out[offset] = min(fields[offset], 1)
    return out


def _kept(columns: list[list[Any]], layers: int, limit: int = MAX_LAYERS) -> list[int]:
    if not columns:
        return [0, 1]
    needed = max(_first_of_each(column) for column in columns) + 1
    if needed <= limit:
        return list(range(max(needed, 2)))
    rows = list(zip(*columns, strict=True))
    runs = [i for i in range(layers) if i == 0 or rows[i] != rows[i - 1]][:limit]
    return runs if len(runs) >= 2 else [0, 1]


def _kept_sharing(columns: list[list[Any]], layers: int, shared: int) -> list[int]:
    """The layers kept where the last `shared` read earlier layers' keys and values
    (`num_kv_shared_layers`, Gemma 4's): those before them shrunk as any (at most
    `MAX_LAYERS - 2`), then one shared layer per run of equal ones, at most 2."""
    first = layers - shared
    head = _kept([column[:first] for column in columns], first, MAX_LAYERS - 2)[:first]
    tail = _kept([column[first:] for column in columns], shared, 2)[:shared]
    return head + [first + i for i in tail]


def _shrunk_setting(setting: Any, fields: dict[str, Any]) -> Any:
    """One layer's own settings (`per_layer_config`), shrunk as the config's: a head width
    in proportion to the config's."""
    if not isinstance(setting, dict):
        return setting
    out = shrunk(setting)
    head_dim = setting.get("head_dim")
    if _is_int(head_dim) and _is_int(fields.get("head_dim")):
        twin_head = _shrunk_heads(fields).get("head_dim", WIDTH // HEADS)
        out["head_dim"] = max(2, twin_head * head_dim // fields["head_dim"])
    return out


def _first_of_each(column: list[Any]) -> int:
    """The index by which every distinct value of `column` has appeared."""
    seen = {repr(v): i for i, v in reversed(list(enumerate(column)))}
    return max(seen.values())


def _shrunk_heads(fields: dict[str, Any]) -> dict[str, Any]:
    """Key/value heads, the head width and the widths tied to it or to d_model, the state
    space heads: each kept as the kind it is (module docstring)."""
    out: dict[str, Any] = {}
    heads, width = _int(fields, _HEADS), _int(fields, _WIDTHS)
    for name in _KV_HEADS:
        kv = fields.get(name)
        if _is_int(kv) and heads:
            out[name] = HEADS if kv >= heads else 1 if kv == 1 else 2
    natural = width // heads if heads and width else None
    original_head = _int(fields, _HEAD_DIMS) or natural
    for name in _HEAD_DIMS:
        if _is_int(fields.get(name)):
            out[name] = WIDTH // HEADS if fields[name] == natural else 2 * WIDTH // HEADS
            if fields[name] == fields.get("qk_rope_head_dim"):  # MLA: the rotated part
                out[name] = _SIZES["qk_rope_head_dim"]
    twin_head = _int(out, _HEAD_DIMS) or WIDTH // HEADS
    rotary = fields.get("rotary_dim")
    if _is_int(rotary) and original_head:  # GPT-J: rotate the first rotary_dim of each head
        out["rotary_dim"] = max(2, 2 * round(rotary * twin_head / original_head / 2))
    projection = fields.get("word_embed_proj_dim")
    if _is_int(projection):  # OPT: a projection between the embedding and the stream
        out["word_embed_proj_dim"] = WIDTH if projection == width else WIDTH // 2
    for name, narrower in _EMBEDDING_WIDTHS.items():  # ELECTRA's, RemBERT's projections
        if _is_int(fields.get(name)):
            out[name] = WIDTH if fields[name] == width else narrower
    out |= {  # other widths that are d_model's (RWKV's attention, xLSTM's embedding)
        k: WIDTH
        for k, v in fields.items()
        if k.endswith(("_size", "_dim", "_width")) and v == width and _is_int(v)
        and k not in _SIZES and k not in out
    }  # fmt: skip
    if _is_int(fields.get("mamba_n_heads")):  # heads x head width = expand x d_model
        expand = fields.get("mamba_expand") or 2
        out["mamba_n_heads"] = expand * WIDTH // _SIZES["mamba_d_head"]
        if _is_int(fields.get("mamba_d_ssm")):
            out["mamba_d_ssm"] = expand * WIDTH
    return out


def _token_ids(fields: dict[str, Any], vocab: Any) -> dict[str, Any]:
    """Special-token ids past the twin's vocabulary, moved inside it (the last ids)."""
    if not _is_int(vocab):
        return {}
    out, spare = {}, iter(range(vocab - 1, 0, -1))
    for name, value in fields.items():
        if not name.endswith(("_token_id", "_token_index", "_token_ids")):
            continue
        if _is_int(value) and value >= vocab:
            out[name] = next(spare)
        elif isinstance(value, list) and any(_is_int(v) and v >= vocab for v in value):
            out[name] = [next(spare) if _is_int(v) and v >= vocab else v for v in value]
    return out


def _int(fields: dict[str, Any], names: tuple[str, ...]) -> int | None:
    return next((fields[n] for n in names if _is_int(fields.get(n))), None)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def random_hf_model(model_class: Callable[[Any], Any], config: Any, seed: int = 0) -> Any:
    """`model_class(config)` in float32 with eager attention and experts (the reference
    forms: HF's grouped experts take no float64), in eval mode, its weights drawn as the
    module docstring says (seeded: the same twin every time)."""
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    # The constructor's own draws seeded too: vectors keep them under the added noise (a
    # gated delta net's `A_log`, drawn uniformly at construction).
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_class(config).float().eval()
    generator = torch.Generator().manual_seed(seed)

    def normal(shape: torch.Size, std: float) -> torch.Tensor:
        return std * torch.randn(shape, generator=generator)

    computed = _computed_tables(model)
    with torch.no_grad():
        for param in model.parameters():  # tied ones once
            if param.numel() == 0 or id(param) in computed:  # 0 wide: DeepSeek V2's no experts
                continue
            if param.ndim >= 2:
                param.copy_(normal(param.shape, 1 / math.sqrt(param.shape[-1])))
            else:
                param.add_(normal(param.shape, _VECTOR_STD))
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding) and id(module.weight) not in computed:
                module.weight.copy_(normal(module.weight.shape, _EMBEDDING_STD))
    return model


def _computed_tables(model: Any) -> set[int]:
    """The frozen embedding tables (`nn.Embedding(..., _freeze=True)`: sinusoids the model
    computes at construction and never trains, RoFormer's, Marian's), kept as computed:
    a checkpoint holds those numbers, and a model may read them as angles. Their ids."""
    return {
        id(module.weight)
        for module in model.modules()
        if isinstance(module, torch.nn.Embedding) and not module.weight.requires_grad
    }
