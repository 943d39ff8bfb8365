"""The mixture-of-experts families and Gemma 3 against `transformers` itself: logits, the
residual stream entering each block, attention patterns, router logits, greedy generation
(plain and left-padded), a padded batch against each sequence alone, a saved directory, and
a bfloat16 directory loaded without a float32 copy.

Each case is a tiny random model built from the family's own config class (2 layers, d_model
32, grouped keys and values), reaching the family's variants: Mixtral's sliding window; Qwen2-
MoE's gated shared expert and q/k/v biases, with the top-k weights renormalised and not, and
windows on some layers only; Qwen3-MoE's per-head q/k norms and `head_dim` != d_model / heads;
OLMoE's whole-projection q/k norms over 16 experts, 4 per token; GPT-OSS's attention sinks,
alternating sliding and full layers, YaRN rotary, biased router and clamped experts; Gemma 3's
local and global layers with their own rotary bases (the global one linearly scaled), q/k
norms, `1 + w` gains and the final soft cap (its config's attention soft cap is one HF's
Gemma 3 never applies: the import agrees by ignoring it); and two older dense families, GPT-J
(parallel block with one shared LayerNorm, partial rotary in its own pair layout) and OPT
(learned positions with their offset of two, biases everywhere, tied unembedding). Every norm
gain, bias and sink is moved away from its neutral value, so that one the conversion forgot
changes the logits.

HF is run with its eager attention and eager experts (its loop over experts: the reference
implementation). A float64 HF model still rounds some steps to float32: its RMSNorms, its
attention softmax and its router softmax. As in tests/hf/test_hf_families.py, the float64 checks
run HF's own model with every float32 request made float64 (`exact`: `InFloat64Throughout`) and
agree with it to 1e-10; stock float64 HF agrees to 1e-5.
"""

import pytest
import torch
from helpers.hf_pairs import (
    LOGIT_REFERENCES,
    PAD,
    TOKENS,
    Pair,
    assert_greedy_generation_equal,
    assert_left_padded_batch_equals_each_prompt,
    assert_left_padded_generation_equal,
    assert_logits_equal,
    assert_patterns_equal_hf_attentions,
    assert_resid_pre_equals_hidden_states,
    assert_saved_directory_loads_like_the_live_model,
    assert_shares_no_memory_with_hf,
    hf_constants,
    max_abs,
    pair_fixtures,
)
from helpers.wide_tensors import LargeFloat32Tensors
from safetensors.torch import load_file

from hookedattn import HookedTransformer
from hookedattn.testing import assert_residual_identities

transformers = pytest.importorskip("transformers")

VOCAB = 64
COMMON = dict(
    vocab_size=VOCAB, max_position_embeddings=64, num_hidden_layers=2, pad_token_id=PAD,
    bos_token_id=1, eos_token_id=None, attn_implementation="eager",
    experts_implementation="eager", initializer_range=0.3, hidden_size=32,
    num_attention_heads=4, num_key_value_heads=2,
)  # fmt: skip
QWEN2_MOE = dict(
    intermediate_size=48, moe_intermediate_size=16, shared_expert_intermediate_size=24,
    num_experts=8, num_experts_per_tok=2, use_sliding_window=True, sliding_window=4,
    max_window_layers=1,
)  # fmt: skip
# HF class, config class, config overrides. Windows are 4 tokens, shorter than TOKENS.
CASES = {
    "mixtral": ("MixtralForCausalLM", "MixtralConfig", dict(
        intermediate_size=16, num_local_experts=8, num_experts_per_tok=2, sliding_window=4)),
    "qwen2_moe": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(**QWEN2_MOE, norm_topk_prob=False)),
    "qwen2_moe_renormalised": ("Qwen2MoeForCausalLM", "Qwen2MoeConfig", dict(
        **QWEN2_MOE, norm_topk_prob=True, tie_word_embeddings=True)),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(
        head_dim=12, intermediate_size=48, moe_intermediate_size=16, num_experts=8,
        num_experts_per_tok=2, norm_topk_prob=True, use_sliding_window=True, sliding_window=4)),
    "olmoe": ("OlmoeForCausalLM", "OlmoeConfig", dict(
        intermediate_size=8, num_experts=16, num_experts_per_tok=4, norm_topk_prob=False)),
    "gpt_oss": ("GptOssForCausalLM", "GptOssConfig", dict(
        head_dim=8, intermediate_size=16, num_local_experts=8, num_experts_per_tok=2,
        sliding_window=4, swiglu_limit=1.5, rope_parameters=dict(
            rope_type="yarn", rope_theta=1e4, factor=4.0, beta_fast=8.0, beta_slow=1.0,
            truncate=False, original_max_position_embeddings=16))),
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig", dict(
        head_dim=16, intermediate_size=48, query_pre_attn_scalar=24, sliding_window=4,
        layer_types=["sliding_attention", "full_attention"], attn_logit_softcapping=2.0,
        final_logit_softcapping=3.0, rope_parameters=dict(
            sliding_attention=dict(rope_type="default", rope_theta=100.0),
            full_attention=dict(rope_type="linear", factor=2.0, rope_theta=5e4)))),
    # Stretch: two older dense families (no grouped keys and values).
    "gptj": ("GPTJForCausalLM", "GPTJConfig", dict(
        n_embd=32, n_head=4, n_layer=2, n_positions=64, rotary_dim=4, n_inner=48,
        activation_function="gelu_new")),
    "opt": ("OPTForCausalLM", "OPTConfig", dict(
        ffn_dim=48, word_embed_proj_dim=32, num_key_value_heads=None)),
}  # fmt: skip


def make_hf(case: str, dtype: torch.dtype = torch.float32):
    architecture, config_class, overrides = CASES[case]
    config = getattr(transformers, config_class)(**{**COMMON, **overrides})
    torch.manual_seed(0)
    hf = getattr(transformers, architecture)(config).eval()
    gemma = case.startswith("gemma")
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if "norm" in name or ".ln_" in name:
                # Gemma's gain is `1 + w`, so its neutral value is 0, not 1.
                neutral = 0.0 if gemma or name.endswith("bias") else 1.0
                param.copy_(neutral + 0.3 * torch.randn_like(param))
            elif name.endswith(("bias", "sinks")):
                param.copy_(0.3 * torch.randn_like(param))
    return hf.to(dtype)


case, pair32, pair64 = pair_fixtures(CASES, make_hf)


def is_moe(pair: Pair) -> bool:
    return pair.ours.cfg.num_experts is not None


# ---------------------------------------------------------------- agreement
def test_the_config_is_the_family(case, pair32):
    cfg, hf_config = pair32.ours.cfg, pair32.hf.config
    assert cfg.original_architecture == CASES[case][0]
    assert (cfg.n_layers, cfg.d_model, cfg.d_vocab) == (2, hf_config.hidden_size, VOCAB)
    if case not in ("gptj", "opt"):
        assert cfg.n_kv_heads == 2 < cfg.n_heads
    if is_moe(pair32):
        assert cfg.experts_per_token == hf_config.num_experts_per_tok < cfg.num_experts


@pytest.mark.parametrize("reference", LOGIT_REFERENCES)
def test_logits_equal(reference, pair32, pair64):
    assert_logits_equal(reference, pair32, pair64)


def test_the_default_hf_experts_agree_too(case, pair32):
    # transformers' default experts ("grouped_mm" where torch has it) and its sdpa attention.
    hf = make_hf(case)
    hf.set_attn_implementation("sdpa") if hf._supports_sdpa else None
    if is_moe(pair32):
        hf.set_experts_implementation("grouped_mm")
    with torch.no_grad():
        assert max_abs(pair32.ours(TOKENS), hf(TOKENS).logits) <= 1e-5


def test_residual_stream_equals_hf_hidden_states(pair64):
    assert_resid_pre_equals_hidden_states(pair64)


def test_attention_patterns_equal_hf_eager_attentions(pair64):
    assert_patterns_equal_hf_attentions(pair64)


def test_router_logits_equal_hfs(pair64):
    if not is_moe(pair64):
        pytest.skip("a dense family has no router")
    with torch.no_grad():
        expected = pair64.exact(TOKENS, output_router_logits=True).router_logits
    _, cache = pair64.ours.run_with_cache(TOKENS, names_filter=lambda n: "router" in n)
    for layer, logits in enumerate(expected):
        ours = cache[f"blocks.{layer}.mlp.hook_router_logits"].flatten(0, 1)
        assert max_abs(ours, logits) <= 1e-10, layer


def test_the_imported_model_keeps_every_residual_identity(pair64):
    _, cache = pair64.ours.run_with_cache(TOKENS)
    constants = hf_constants(pair64.hf.config)
    assert not assert_residual_identities(pair64.ours, cache, constants=constants).skipped


def test_greedy_generation_equals_hf_generate(pair32):
    assert_greedy_generation_equal(pair32)


def test_a_left_padded_batch_equals_each_prompt_alone(pair64):
    assert_left_padded_batch_equals_each_prompt(pair64)


def test_left_padded_generation_equals_hf_generate(pair32):
    assert_left_padded_generation_equal(pair32)


def test_a_saved_directory_loads_like_the_live_model(pair32, tmp_path):
    # The files keep one tensor per expert (`save_pretrained`'s layout); the live model
    # stacks them.
    assert_saved_directory_loads_like_the_live_model(pair32, tmp_path)


def test_the_import_shares_no_memory_with_the_hf_model(pair32):
    assert_shares_no_memory_with_hf(pair32)


@pytest.mark.parametrize("case", ["mixtral", "gpt_oss"])
def test_a_bfloat16_directory_loads_without_a_float32_copy(case, tmp_path):
    make_hf(case).to(torch.bfloat16).save_pretrained(tmp_path)
    smallest = 32 * 8  # no float32 tensor as large as one expert's smallest matrix
    with LargeFloat32Tensors(smallest) as recorder:
        model = HookedTransformer.from_hf(tmp_path, dtype=torch.bfloat16)
    assert recorder.seen == []
    stored = load_file(str(tmp_path / "model.safetensors"))
    moe = model.blocks[1].mlp
    if case == "mixtral":  # one file tensor per expert: w3 is the up projection, [d_mlp d_model]
        up = stored["model.layers.1.block_sparse_moe.experts.5.w3.weight"]
        assert torch.equal(moe.W_in[5], up.T)
    else:  # stacked [expert d_model (d_mlp gate_up)], gate and up interleaved
        gate_up = stored["model.layers.1.mlp.experts.gate_up_proj"]
        assert torch.equal(moe.W_gate[5], gate_up[5, :, 0::2])
        assert torch.equal(moe.W_in[5], gate_up[5, :, 1::2])
