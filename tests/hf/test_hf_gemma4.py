"""Gemma 4 (`Gemma4ForCausalLM`, `Gemma4UnifiedForCausalLM` and their multimodal
`...ForConditionalGeneration`, imported as their language models) is refused by convention,
and the refusal names what is missing: the global layers' attention is of another shape
than the local layers' (`per_layer_config` widens their heads, `head_dim`, and on the
sizes whose keys serve as values narrows their key/value heads, `num_key_value_heads`),
which one `d_head` and one `n_key_value_heads` for every block cannot hold; and the pieces
the config asks for that nothing imports (the small sizes' per-layer input embeddings).
Each tiny twin is built here and imported live; the refusal must come before any weight is
read, as a ValueError, never as a wrong import.
"""

import pytest
from helpers.twins import tiny_twin

from hookedattn import HookedTransformer

transformers = pytest.importorskip("transformers")

GEMMA4_TYPES = ("gemma4_text", "gemma4", "gemma4_unified_text", "gemma4_unified")


def _refusal(model_type: str, **fields) -> str:
    with pytest.raises(ValueError) as refused:
        HookedTransformer.from_hf(tiny_twin(model_type, **fields))
    return str(refused.value)


@pytest.mark.parametrize("model_type", GEMMA4_TYPES)
def test_the_global_layers_wider_heads_are_named_in_the_refusal(model_type):
    # The twin's local heads are 32 wide, its global layer's (layer 5) 64: four query heads.
    message = _refusal(model_type)
    assert "decoder layers hold different pieces (layers [5] differ" in message
    assert "self_attn.q_proj Linear(256, 64) in layer 5, Linear(128, 64) in layer 0" in message
    assert "per_layer_config sets head_dim in layers [5]" in message


@pytest.mark.parametrize("model_type", ["gemma4_text", "gemma4"])
def test_the_per_layer_input_embeddings_are_named_in_the_refusal(model_type):
    assert "per-layer input embeddings (hidden_size_per_layer_input)" in _refusal(model_type)


@pytest.mark.parametrize("model_type", ["gemma4_unified_text", "gemma4_unified"])
def test_the_unified_models_ask_for_no_per_layer_input_embeddings(model_type):
    # Their config has no `hidden_size_per_layer_input`: the refusal names no such piece.
    assert "per-layer input embeddings" not in _refusal(model_type)


def test_keys_serving_as_values_and_fewer_global_key_value_heads_are_named():
    # The larger sizes' global layers read values off the keys' map, with fewer heads.
    message = _refusal("gemma4_text", attention_k_eq_v=True, num_global_key_value_heads=1)
    assert "per_layer_config sets head_dim in layers [5], num_key_value_heads in layers [5]" in (
        message
    )
    assert "keys serving as values (attention_k_eq_v)" in message


def test_a_released_sized_config_alone_is_refused_before_any_weight(tmp_path):
    # The default config is the E2B model's (30 layers, heads 256 wide, 512 globally); the
    # folder holds no weights, so a refusal that read any would fail otherwise.
    transformers.Gemma4TextConfig(architectures=["Gemma4ForCausalLM"]).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"per_layer_config sets head_dim in layers \[5\]"):
        HookedTransformer.from_hf(tmp_path)
