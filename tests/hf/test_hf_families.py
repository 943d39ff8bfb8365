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
from helpers.float64_hf import InFloat64Throughout

from hookedattn import HookedTransformer
from hookedattn.testing import (
    Constants,
    assert_residual_identities,
    checkpoint_constants,
    published_constants,
)

transformers = pytest.importorskip("transformers")

VOCAB, PAD = 64, 0
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
TOKENS = torch.tensor(
    [[5, 17, 3, 42, 8, 8, 60, 1, 29, 11, 38, 7], [9, 63, 12, 12, 33, 7, 2, 50, 9, 4, 4, 21]]
)


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


class Pair:
    """An HF model and our import of it, in one dtype; in float64 also `exact`, HF's model
    computing in float64 throughout (`hf_float64_math`)."""

    def __init__(self, case: str, dtype: torch.dtype) -> None:
        self.hf = make_hf(case, dtype)
        self.ours = HookedTransformer.from_hf(self.hf)
        if dtype == torch.float64:
            self.exact = InFloat64Throughout(make_hf(case, dtype))


@pytest.fixture(scope="module", params=list(CASES))
def case(request):
    return request.param


@pytest.fixture(scope="module")
def pair32(case):
    return Pair(case, torch.float32)


@pytest.fixture(scope="module")
def pair64(case):
    return Pair(case, torch.float64)


def max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.detach() - b.detach()).abs().max())


def test_the_config_is_the_family(case, pair32):
    cfg, hf_config = pair32.ours.cfg, pair32.hf.config
    assert cfg.original_architecture == CASES[case][0]
    assert (cfg.n_layers, cfg.d_model, cfg.d_vocab) == (2, hf_config.hidden_size, VOCAB)
    window = getattr(hf_config, "sliding_window", None)
    if window is not None:
        assert cfg.window_size == window < TOKENS.shape[1]


# Our logits against HF's: (our dtype, the HF forward, the largest difference). Stock HF in
# float64 rounds some steps to float32, so only HF's float64 math (`exact`) agrees to 1e-10.
LOGIT_REFERENCES = {
    "hf_float32": (torch.float32, "hf", 1e-5),
    "hf_float64": (torch.float64, "exact", 1e-10),
    "stock_hf_float64_to_its_float32_roundings": (torch.float64, "hf", 1e-5),
}


@pytest.mark.parametrize("reference", LOGIT_REFERENCES)
def test_logits_equal(reference, pair32, pair64):
    dtype, forward, largest = LOGIT_REFERENCES[reference]
    pair = pair32 if dtype == torch.float32 else pair64
    with torch.no_grad():
        expected = getattr(pair, forward)(TOKENS).logits
    assert max_abs(pair.ours(TOKENS), expected) <= largest


def test_residual_stream_equals_hf_hidden_states(pair64):
    with torch.no_grad():
        hidden = pair64.exact(TOKENS, output_hidden_states=True).hidden_states
    _, cache = pair64.ours.run_with_cache(TOKENS)
    # HF's hidden_states: the input of each block, then the final one after the last norm.
    for layer in range(pair64.ours.cfg.n_layers):
        assert max_abs(cache["resid_pre", layer], hidden[layer]) <= 1e-10, layer
    assert max_abs(cache["ln_final.hook_out"], hidden[-1]) <= 1e-10


def test_attention_patterns_equal_hf_eager_attentions(pair64):
    with torch.no_grad():
        attentions = pair64.exact(TOKENS, output_attentions=True).attentions
    _, cache = pair64.ours.run_with_cache(TOKENS)
    for layer, expected in enumerate(attentions):
        assert max_abs(cache["pattern", layer], expected) <= 1e-10, layer


def hf_constants(config) -> Constants:
    """The constants the checkpoint's own config states, under HF's names: the norms'
    epsilon and what the scores are divided by (Gemma 2: `sqrt(query_pre_attn_scalar)`)."""
    d_head = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    eps_names = ("rms_norm_eps", "layer_norm_eps", "layer_norm_epsilon")
    eps = next(getattr(config, name) for name in eps_names if hasattr(config, name))
    attn_scale = getattr(config, "query_pre_attn_scalar", d_head) ** 0.5
    return published_constants(d_head, eps=eps, attn_scale=attn_scale)


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
    prompt = TOKENS[:, :5]
    expected = pair32.hf.generate(prompt, max_new_tokens=8, do_sample=False, pad_token_id=PAD)
    ours = pair32.ours.generate(prompt, max_new_tokens=8, do_sample=False, stop_at_eos=False)
    assert torch.equal(ours, expected)


def test_a_left_padded_batch_equals_each_prompt_alone(pair64):
    lengths = (9, 12)  # the first prompt is padded by 3, past the 4-token windows
    tokens = torch.full((2, 12), PAD)
    mask = torch.zeros(2, 12, dtype=torch.long)
    for row, length in enumerate(lengths):
        tokens[row, 12 - length :] = TOKENS[row, :length]
        mask[row, 12 - length :] = 1
    logits = pair64.ours(tokens, attention_mask=mask)
    for row, length in enumerate(lengths):
        alone = pair64.ours(TOKENS[row : row + 1, :length])[0]
        assert max_abs(logits[row, 12 - length :], alone) <= 1e-10, row


# Stock HF in float32: in float64 its fully masked padding rows become NaN (a float64 mask
# minimum cast to float32 is -inf before its softmax), and the NaN reaches real tokens.
def test_left_padded_generation_equals_hf_generate(pair32):
    tokens = torch.tensor([[PAD, PAD, PAD, 5, 17, 3], [8, 60, 1, 29, 4, 30]])
    mask = (torch.arange(6) >= torch.tensor([[3], [0]])).long()
    expected = pair32.hf.generate(
        tokens, attention_mask=mask, max_new_tokens=8, do_sample=False,
        pad_token_id=PAD,
    )  # fmt: skip
    ours = pair32.ours.generate(
        tokens, max_new_tokens=8, do_sample=False, stop_at_eos=False, attention_mask=mask
    )
    assert torch.equal(ours, expected)


def test_a_saved_directory_loads_like_the_live_model(pair32, tmp_path):
    pair32.hf.save_pretrained(tmp_path)
    loaded = HookedTransformer.from_hf(tmp_path)
    assert loaded.cfg == pair32.ours.cfg.replace(model_name=loaded.cfg.model_name)
    ours = pair32.ours.state_dict()
    assert loaded.state_dict().keys() == ours.keys()
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, ours[name]), name


def test_the_import_shares_no_memory_with_the_hf_model(pair32):
    hf_pointers = {t.untyped_storage().data_ptr() for t in pair32.hf.state_dict().values()}
    for name, tensor in pair32.ours.state_dict().items():
        assert tensor.untyped_storage().data_ptr() not in hf_pointers, name
