"""Every imported family against `transformers` itself: logits, the residual stream entering
each block, attention patterns, greedy generation with our KV cache, left padding.

No weights can be downloaded here, so each case builds a tiny HF model from its config with
random weights, then moves every norm gain away from its neutral value and every bias away
from zero (HF initialises them to exactly that), so that a gain or bias the conversion
forgot, or read from the wrong tensor, changes the logits. The configs reach each family's
variants: partial rotary, parallel and sequential NeoX blocks, grouped keys and values,
"llama3" and "linear" rotary scaling, tied embeddings, q/k/v biases, windows shorter than
the sequences, per-head and whole-projection q/k norms, `head_dim` != d_model / n_heads,
Gemma's soft caps, Gemma's and OLMo's norms after the sublayers, Phi-3's fused q/k/v and
gate/up projections (unequal parts) with partial rotary.

A float64 HF model is not float64 throughout: its RMSNorm normalises in float32
(`hidden_states.to(torch.float32)`) and its eager attention takes the softmax in float32
(`softmax(..., dtype=torch.float32)`), so stock HF agrees with itself (eager against sdpa)
only to ~1e-6. The float64 checks therefore run HF's own model with every float32 request
made float64 (`InFloat64Throughout`: `hookedattn.testing.float64_throughout`, a torch
function mode; HF's code runs as written, its constants as built), and agree with it to
1e-10; agreement with stock float64 HF, bounded by those float32
roundings, is checked at 1e-5.
"""

import pytest
import torch
from helpers.hf_pairs import (
    LOGIT_REFERENCES,
    PAD,
    TOKENS,
    assert_greedy_generation_equal,
    assert_left_padded_batch_equals_each_prompt,
    assert_left_padded_generation_equal,
    assert_logits_equal,
    assert_patterns_equal_hf_attentions,
    assert_resid_pre_equals_hidden_states,
    assert_saved_directory_loads_like_the_live_model,
    assert_shares_no_memory_with_hf,
    hf_constants,
    pair_fixtures,
)

from hookedattn.testing import assert_residual_identities, checkpoint_constants

transformers = pytest.importorskip("transformers")

VOCAB = 64
COMMON = dict(
    vocab_size=VOCAB, max_position_embeddings=64, num_hidden_layers=2, pad_token_id=PAD,
    bos_token_id=1, eos_token_id=None, attn_implementation="eager", initializer_range=0.3,
)  # fmt: skip
# No end-of-sequence token: HF's `generate` would stop there, or with `min_new_tokens` make
# it unpickable, which our greedy loop (stop_at_eos=False) does not.
LLAMA_LIKE = dict(
    hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=2
)
LLAMA3_ROPE = dict(
    rope_type="llama3", rope_theta=10000.0, factor=8.0, low_freq_factor=1.0,
    high_freq_factor=4.0, original_max_position_embeddings=16,
)  # fmt: skip
# HF class, config class, config overrides; the window (where there is one) is 4 tokens,
# shorter than TOKENS and than the generated sequences.
CASES = {
    "gpt_neox": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(
        hidden_size=32, intermediate_size=64, num_attention_heads=4, rotary_pct=0.5,
        use_parallel_residual=True, hidden_act="gelu")),
    "gpt_neox_sequential": ("GPTNeoXForCausalLM", "GPTNeoXConfig", dict(
        hidden_size=32, intermediate_size=64, num_attention_heads=4, rotary_pct=0.25,
        use_parallel_residual=False, hidden_act="gelu_new", tie_word_embeddings=True)),
    "llama": ("LlamaForCausalLM", "LlamaConfig", dict(**LLAMA_LIKE, rope_parameters=LLAMA3_ROPE)),
    "llama_linear_rope_biases_tied": ("LlamaForCausalLM", "LlamaConfig", dict(
        hidden_size=32, intermediate_size=64, num_attention_heads=4, num_key_value_heads=4,
        attention_bias=True, tie_word_embeddings=True,
        rope_parameters=dict(rope_type="linear", rope_theta=500.0, factor=2.0))),
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(**LLAMA_LIKE, sliding_window=4)),
    "qwen2": ("Qwen2ForCausalLM", "Qwen2Config", dict(
        **LLAMA_LIKE, tie_word_embeddings=True, use_sliding_window=True, sliding_window=4,
        max_window_layers=1)),
    "qwen3": ("Qwen3ForCausalLM", "Qwen3Config", dict(**LLAMA_LIKE, head_dim=16)),
    "gemma2": ("Gemma2ForCausalLM", "Gemma2Config", dict(
        **LLAMA_LIKE, head_dim=16, query_pre_attn_scalar=24, sliding_window=4,
        attn_logit_softcapping=2.0, final_logit_softcapping=3.0)),
    "olmo2": ("Olmo2ForCausalLM", "Olmo2Config", dict(**LLAMA_LIKE)),
    "phi3": ("Phi3ForCausalLM", "Phi3Config", dict(**LLAMA_LIKE, sliding_window=4,
        rope_parameters=dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=0.5))),
}  # fmt: skip


def make_hf(case: str, dtype: torch.dtype = torch.float32):
    architecture, config_class, overrides = CASES[case]
    config = getattr(transformers, config_class)(**COMMON, **overrides)
    torch.manual_seed(0)
    hf = getattr(transformers, architecture)(config).eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "norm" in name:
                # Gemma's gain is `1 + w`, so its neutral value is 0, not 1.
                neutral = 0.0 if case == "gemma2" or name.endswith("bias") else 1.0
                param.copy_(neutral + 0.3 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.1 * torch.randn_like(param))
    return hf.to(dtype)


case, pair32, pair64 = pair_fixtures(CASES, make_hf)


def test_the_config_is_the_family(case, pair32):
    cfg, hf_config = pair32.ours.cfg, pair32.hf.config
    assert cfg.original_architecture == CASES[case][0]
    assert (cfg.n_layers, cfg.d_model, cfg.d_vocab) == (2, hf_config.hidden_size, VOCAB)
    window = getattr(hf_config, "sliding_window", None)
    if window is not None:
        assert cfg.window_size == window < TOKENS.shape[1]


@pytest.mark.parametrize("reference", LOGIT_REFERENCES)
def test_logits_equal(reference, pair32, pair64):
    assert_logits_equal(reference, pair32, pair64)


def test_residual_stream_equals_hf_hidden_states(pair64):
    assert_resid_pre_equals_hidden_states(pair64)


def test_attention_patterns_equal_hf_eager_attentions(pair64):
    assert_patterns_equal_hf_attentions(pair64)


def test_the_imported_model_keeps_every_residual_identity(pair64):
    _, cache = pair64.ours.run_with_cache(TOKENS)
    assert_residual_identities(pair64.ours, cache, constants=hf_constants(pair64.hf.config))


def test_the_identities_read_the_constants_the_checkpoint_states(pair64):
    # Recorded at import (model.checkpoint_config), read apart from the import's translation.
    model = pair64.ours
    recorded = checkpoint_constants(model.cfg.d_head, model.checkpoint_config)
    stated = hf_constants(pair64.hf.config)
    assert (recorded.eps, recorded.attn_scale) == (stated.eps, stated.attn_scale)
    _, cache = model.run_with_cache(TOKENS)
    assert_residual_identities(model, cache)


def test_a_translation_that_loses_the_checkpoints_epsilon_fails_naming_it(pair64):
    model = pair64.ours.copy()
    name = next(n for n in ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon")
                if n in model.checkpoint_config)  # fmt: skip
    model.checkpoint_config = {**model.checkpoint_config, name: 10 * model.cfg.eps}
    _, cache = model.run_with_cache(TOKENS)
    with pytest.raises(AssertionError, match=r"eps: .*\(from the checkpoint's config\)"):
        assert_residual_identities(model, cache)


def test_greedy_generation_equals_hf_generate(pair32):
    assert_greedy_generation_equal(pair32)


def test_a_left_padded_batch_equals_each_prompt_alone(pair64):
    assert_left_padded_batch_equals_each_prompt(pair64)


def test_left_padded_generation_equals_hf_generate(pair32):
    assert_left_padded_generation_equal(pair32)


def test_a_saved_directory_loads_like_the_live_model(pair32, tmp_path):
    assert_saved_directory_loads_like_the_live_model(pair32, tmp_path)


def test_the_import_shares_no_memory_with_the_hf_model(pair32):
    assert_shares_no_memory_with_hf(pair32)
