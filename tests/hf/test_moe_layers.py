"""Which blocks hold a mixture of experts (`moe_layers`, `layer_is_moe`): the config field's
checks and save/load, the checkpoint fields that say it (`_moe_layers`) against the layers
`transformers` builds from them, and imports of models whose mixtures are not in the last
blocks only, exact against `transformers` in float64.
"""

import json

import pytest
import torch

from hookedattn import HookedTransformer, HookedTransformerConfig

transformers = pytest.importorskip("transformers")
from hookedattn.core.hf import _experts, _moe_layers  # noqa: E402

TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29, 33, 4, 12]])
BASE = dict(
    n_layers=4, d_model=16, n_ctx=32, d_head=4, n_heads=4, d_mlp=8, d_vocab=64,
    act_fn="silu", gated_mlp=True, normalization_type="RMS", positional_embedding_type="rotary",
    num_experts=4, experts_per_token=2, d_mlp_dense=12, seed=0, dtype="float64",
)  # fmt: skip
PATTERN = (False, True, False, True)


def test_layer_is_moe_follows_moe_layers():
    cfg = HookedTransformerConfig(**BASE, moe_layers=PATTERN)
    assert [cfg.layer_is_moe(i) for i in range(4)] == list(PATTERN)


def test_layer_is_moe_keeps_dense_first_layers_from_n_dense_layers():
    cfg = HookedTransformerConfig(**BASE, n_dense_layers=3)
    assert [cfg.layer_is_moe(i) for i in range(4)] == [False, False, False, True]


def test_a_model_builds_dense_and_expert_blocks_as_moe_layers_says():
    model = HookedTransformer(HookedTransformerConfig(**BASE, moe_layers=PATTERN))
    experts = [hasattr(block.mlp, "W_router") for block in model.blocks]
    assert experts == list(PATTERN)
    assert model.blocks[0].mlp.W_in.shape == (16, 12)  # d_mlp_dense wide


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(moe_layers=(True, False)), r"moe_layers must be 4 booleans.*\(True, False\)"),
        (dict(moe_layers=(True,) * 5), r"moe_layers must be 4 booleans.*\(True, True, True"),
        (dict(moe_layers=PATTERN, n_dense_layers=1), r"n_dense_layers=1 and moe_layers=.*alone"),
        (dict(moe_layers=(False,) * 4), r"moe_layers=\(False, False, False, False\) has no"),
        (dict(moe_layers=PATTERN, d_mlp_dense=None), r"moe_layers=.*give d_mlp_dense"),
    ],
)
def test_a_bad_moe_layers_names_the_value(changes, message):
    with pytest.raises(ValueError, match=message):
        HookedTransformerConfig(**(BASE | changes))


def test_moe_layers_without_experts_is_refused():
    dense = {k: v for k, v in BASE.items() if k not in ("num_experts", "experts_per_token")}
    with pytest.raises(ValueError, match=r"moe_layers is a mixture-of-experts setting"):
        HookedTransformerConfig(**dense, moe_layers=PATTERN)


def test_moe_layers_survives_a_json_round_trip():
    cfg = HookedTransformerConfig(**BASE, moe_layers=PATTERN)
    loaded = HookedTransformerConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert loaded == cfg and loaded.moe_layers == PATTERN


def test_a_saved_model_with_moe_layers_loads_exactly(tmp_path):
    model = HookedTransformer(HookedTransformerConfig(**BASE, moe_layers=PATTERN))
    model.save(tmp_path)
    loaded = HookedTransformer.load(tmp_path)
    assert loaded.cfg == model.cfg
    with torch.no_grad():
        assert torch.equal(loaded(TOKENS), model(TOKENS))


# ---------------------------------------------------------------- the checkpoints' fields
SMALL = dict(vocab_size=64, hidden_size=16, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=24, max_position_embeddings=64, initializer_range=0.3,
             attn_implementation="eager", experts_implementation="eager")  # fmt: skip
QWEN2_MOE = dict(num_hidden_layers=6, num_experts=4, num_experts_per_tok=2,
                 moe_intermediate_size=8, shared_expert_intermediate_size=12)  # fmt: skip
# model type, config changes, the field that says which layers hold experts.
PATTERNS = {
    "every_second_but_a_listed_one": ("qwen2_moe", dict(
        **QWEN2_MOE, decoder_sparse_step=2, mlp_only_layers=[3]), "decoder_sparse_step"),
    "listed_dense_layers": ("qwen3_moe", dict(
        num_hidden_layers=5, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
        head_dim=4, mlp_only_layers=[0, 3]), "decoder_sparse_step"),
    "every_second_between_two_layers": ("ernie4_5_moe", dict(
        num_hidden_layers=6, moe_num_experts=4, moe_k=2, moe_intermediate_size=8,
        moe_layer_start_index=1, moe_layer_end_index=4, moe_layer_interval=2,
        moe_num_shared_experts=1),
        "moe_layer_interval"),
    "every_period_from_an_offset": ("jamba", dict(
        num_hidden_layers=6, num_experts=4, num_experts_per_tok=2, expert_layer_period=3,
        expert_layer_offset=1, attn_layer_period=2, attn_layer_offset=1, mamba_d_state=4,
        mamba_dt_rank=4, use_mamba_kernels=False), "expert_layer_period"),
    "interleaved_every_step": ("llama4_text", dict(
        num_hidden_layers=6, num_local_experts=4, num_experts_per_tok=1,
        intermediate_size_mlp=24, head_dim=4, interleave_moe_layer_step=3), "moe_layers"),
    "dense_first_layers": ("deepseek_v3", dict(
        num_hidden_layers=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
        first_k_dense_replace=2, q_lora_rank=8, kv_lora_rank=8, qk_rope_head_dim=4,
        qk_nope_head_dim=4, v_head_dim=4, n_group=1, topk_group=1), "first_k_dense_replace"),
}  # fmt: skip


def hf_model(model_type: str, changes: dict) -> torch.nn.Module:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    config = transformers.AutoConfig.for_model(model_type, **(SMALL | changes))
    model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    torch.manual_seed(0)
    return model_class(config).eval()


def held(model: torch.nn.Module) -> tuple[bool, ...]:
    """Which of the HF model's layers hold a mixture, as built."""
    return tuple(_experts.block_name(dict(layer.named_children())) is not None
                 for layer in model.model.layers)  # fmt: skip


@pytest.mark.parametrize("case", PATTERNS)
def test_the_field_saying_which_layers_hold_experts_matches_the_built_layers(case):
    model_type, changes, field = PATTERNS[case]
    model = hf_model(model_type, changes)
    flags = held(model)
    assert not all(flags) and any(flags)  # a pattern, not every layer
    assert _moe_layers.pattern_field(model.config, flags) == field
    assert _moe_layers.moe_layers(model.config, field, len(flags)) == flags


def test_a_pattern_no_field_gives_is_refused_naming_the_layers():
    model = hf_model("qwen2_moe", QWEN2_MOE)
    with pytest.raises(ValueError, match=r"experts at \[True, False, True"):
        _moe_layers.pattern_field(model.config, (True, False, True, True, True, True))


@pytest.mark.parametrize("case", ["every_second_but_a_listed_one", "listed_dense_layers",
                                  "every_second_between_two_layers"])  # fmt: skip
def test_a_model_with_experts_in_some_layers_imports_exactly(case):
    model_type, changes, _ = PATTERNS[case]
    reference = hf_model(model_type, changes).double()
    flags = held(reference)
    model = HookedTransformer.from_hf(reference)
    assert tuple(model.cfg.layer_is_moe(i) for i in range(len(flags))) == flags
    with torch.no_grad():
        expected = reference(TOKENS, output_hidden_states=True)
        logits, cache = model.run_with_cache(TOKENS)
    scale = float(expected.logits.abs().max())
    assert float((logits - expected.logits).abs().max()) <= 1e-5 * scale
    for i in range(len(flags) - 1):
        got, want = cache[f"blocks.{i}.hook_resid_post"], expected.hidden_states[i + 1]
        assert float((got - want).abs().max()) <= 1e-5 * float(want.abs().max())


def test_a_family_table_reads_a_dense_block_between_mixtures():
    # GLM-4-MoE-Lite (the DeepSeek family's table, not the convention's): its
    # `mlp_layer_types` may put a dense block anywhere.
    changes = dict(
        num_hidden_layers=3, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
        q_lora_rank=8, kv_lora_rank=8, qk_rope_head_dim=4, qk_nope_head_dim=4, v_head_dim=4,
        head_dim=4, n_group=1, topk_group=1, n_shared_experts=1, num_key_value_heads=4,
        mlp_layer_types=["sparse", "dense", "sparse"],
    )  # fmt: skip
    reference = hf_model("glm4_moe_lite", changes).double()
    model = HookedTransformer.from_hf(reference)
    assert model.cfg.moe_layers == (True, False, True) == held(reference)
    with torch.no_grad():
        expected = reference(TOKENS).logits
        logits = model(TOKENS)
    assert float((logits - expected).abs().max()) <= 1e-5 * float(expected.abs().max())
