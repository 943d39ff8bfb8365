"""GPT-2 imported from HuggingFace `transformers`, checked against `transformers` itself.

No weights can be downloaded here, so each test builds `GPT2LMHeadModel(GPT2Config(...))`
with random weights, and moves the LayerNorm gains and biases (and every bias, which HF
initialises to zero) away from 1 and 0 so that their conversion is really tested.
"""

import pytest
import torch

from hookedattn import CheckpointError, HookedTransformer
from hookedattn.core.hf import convert_gpt2_state_dict, gpt2_config

transformers = pytest.importorskip("transformers")

VOCAB, EOS, PAD = 64, 63, 62


def make_hf(dtype=torch.float32, seed=0, **overrides):
    config = dict(
        n_layer=2, n_embd=32, n_head=4, n_positions=32, vocab_size=VOCAB, bos_token_id=EOS,
        eos_token_id=EOS, pad_token_id=PAD, attn_implementation="eager", initializer_range=0.3,
    )  # fmt: skip
    config.update(overrides)
    torch.manual_seed(seed)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config)).eval()
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if ".ln_" in name:
                base = 1.0 if name.endswith("weight") else 0.0
                param.copy_(base + 0.3 * torch.randn_like(param))
            elif name.endswith("bias"):
                param.copy_(0.1 * torch.randn_like(param))
    return hf.to(dtype)


@pytest.fixture(scope="module")
def hf32():
    return make_hf()


@pytest.fixture(scope="module")
def ours32(hf32):
    return HookedTransformer.from_hf(hf32)


@pytest.fixture(scope="module")
def hf64():
    return make_hf(torch.float64)


@pytest.fixture(scope="module")
def ours64(hf64):
    return HookedTransformer.from_hf(hf64)


TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29], [0, 63, 12, 12, 33, 7, 2, 50, 9]])


def test_config_follows_the_hf_config(ours32):
    cfg = ours32.cfg
    assert (cfg.n_layers, cfg.d_model, cfg.n_heads, cfg.d_head) == (2, 32, 4, 8)
    assert (cfg.n_ctx, cfg.d_vocab, cfg.d_mlp, cfg.act_fn) == (32, VOCAB, 128, "gelu_new")
    assert cfg.original_architecture == "GPT2LMHeadModel"


def test_logits_equal_hf_float32(hf32, ours32):
    with torch.no_grad():
        expected = hf32(TOKENS).logits
    torch.testing.assert_close(ours32(TOKENS), expected, rtol=0, atol=1e-4)


def test_logits_equal_hf_float64(hf64, ours64):
    with torch.no_grad():
        expected = hf64(TOKENS).logits
    torch.testing.assert_close(ours64(TOKENS), expected, rtol=0, atol=1e-10)


def test_residual_stream_equals_hf_hidden_states(hf64, ours64):
    with torch.no_grad():
        hidden = hf64(TOKENS, output_hidden_states=True).hidden_states
    _, cache = ours64.run_with_cache(TOKENS)
    # HF's hidden_states: the input of each block, then the final one after ln_f.
    for layer in range(ours64.cfg.n_layers):
        torch.testing.assert_close(cache["resid_pre", layer], hidden[layer], rtol=0, atol=1e-10)
    torch.testing.assert_close(cache["ln_final.hook_out"], hidden[-1], rtol=0, atol=1e-10)


def test_attention_patterns_equal_hf_eager_attentions(hf64, ours64):
    with torch.no_grad():
        attentions = hf64(TOKENS, output_attentions=True).attentions
    _, cache = ours64.run_with_cache(TOKENS)
    for layer, expected in enumerate(attentions):
        torch.testing.assert_close(cache["pattern", layer], expected, rtol=0, atol=1e-10)


def test_greedy_generation_equals_hf_generate(hf32, ours32):
    prompt = TOKENS[:, :4]
    expected = hf32.generate(prompt, max_new_tokens=10, do_sample=False, min_new_tokens=10)
    ours = ours32.generate(prompt, 10, stop_at_eos=False)
    assert torch.equal(ours, expected)


def test_left_padded_greedy_generation_equals_hf_generate(hf64, ours64):
    tokens = torch.tensor([[PAD, PAD, 5, 17, 3], [8, 60, 1, 29, 4]])
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]])
    expected = hf64.generate(
        tokens, attention_mask=mask, max_new_tokens=10, do_sample=False, min_new_tokens=10
    )
    ours = ours64.generate(tokens, 10, attention_mask=mask, stop_at_eos=False)
    assert torch.equal(ours, expected)


def test_untied_unembedding_is_imported(hf32):
    hf = make_hf(tie_word_embeddings=False, seed=1)
    assert hf.lm_head.weight.data_ptr() != hf.transformer.wte.weight.data_ptr()
    with torch.no_grad():
        expected = hf(TOKENS).logits
    torch.testing.assert_close(HookedTransformer.from_hf(hf)(TOKENS), expected, rtol=0, atol=1e-4)


def test_a_local_directory_loads_like_the_model(tmp_path, hf32, ours32):
    hf32.save_pretrained(tmp_path)
    loaded = HookedTransformer.from_hf(tmp_path)
    torch.testing.assert_close(loaded(TOKENS), ours32(TOKENS), rtol=0, atol=0)
    assert loaded.tokenizer is None  # no tokenizer saved there: token ids only


def test_a_directory_of_base_model_names_loads_like_the_model(tmp_path, hf32, ours32):
    # The original GPT-2 files store the base model's names (`h.0.attn.c_attn.weight`,
    # `wte.weight`), with the unembedding tied to the embedding.
    hf32.transformer.save_pretrained(tmp_path)
    loaded = HookedTransformer.from_hf(tmp_path)
    torch.testing.assert_close(loaded(TOKENS), ours32(TOKENS), rtol=0, atol=0)


def test_a_local_directory_brings_its_tokenizer(tmp_path, hf32):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"w{i}": i for i in range(VOCAB - 2)} | {"<pad>": PAD, "<|endoftext|>": EOS}
    word_level = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    word_level.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(
        tokenizer_object=word_level, bos_token="<|endoftext|>", eos_token="<|endoftext|>"
    )
    hf32.save_pretrained(tmp_path)
    fast.save_pretrained(tmp_path)
    model = HookedTransformer.from_hf(tmp_path)
    assert model.to_tokens("w5 w17").tolist() == [[EOS, 5, 17]]
    assert model.to_str_tokens("w5 w17") == ["<|endoftext|>", "w5", "w17"]


def test_dtype_can_be_chosen(hf32):
    model = HookedTransformer.from_hf(hf32, dtype=torch.float64)
    assert model.W_Q.dtype == torch.float64


# ---------------------------------------------------------------- bad input
def test_another_architecture_is_named():
    # Ergo (a gate on each sublayer's write) is neither a supported family nor recognised.
    match = r"cannot import ErgoForCausalLM \(model_type='ergo'\)"
    with pytest.raises(ValueError, match=match):
        HookedTransformer.from_hf(_other())


def _other() -> "transformers.ErgoForCausalLM":
    from hookedattn.core.hf import _tiny

    config = _tiny.tiny_config(transformers.ErgoConfig(architectures=["ErgoForCausalLM"]))
    return _tiny.random_hf_model(transformers.ErgoForCausalLM, config)


def test_gpt2_without_its_lm_head_says_what_to_pass(hf32):
    with pytest.raises(ValueError, match="pass the GPT2LMHeadModel"):
        HookedTransformer.from_hf(hf32.transformer)


def test_a_directory_of_another_architecture_is_named(tmp_path):
    _other().save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="cannot import ErgoForCausalLM.*supports GPT2LMHead"):
        HookedTransformer.from_hf(tmp_path)


def test_not_a_model():
    with pytest.raises(TypeError, match="takes a transformers model or a local directory"):
        HookedTransformer.from_hf(42)


def test_a_missing_directory(tmp_path):
    with pytest.raises(FileNotFoundError, match="no model directory"):
        HookedTransformer.from_hf(tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match="no config.json"):
        HookedTransformer.from_hf(tmp_path)


def test_missing_extra_and_misshapen_tensors_are_listed(hf32):
    cfg = gpt2_config(hf32.config)
    state = dict(hf32.state_dict())
    del state["transformer.h.1.mlp.c_fc.bias"]
    state["transformer.h.0.attn.rotary"] = torch.zeros(3)
    state["transformer.ln_f.bias"] = torch.zeros(5)
    with pytest.raises(CheckpointError) as error:
        convert_gpt2_state_dict(state, cfg)
    message = str(error.value)
    assert "missing ['transformer.h.1.mlp.c_fc.bias']" in message
    assert "unexpected ['transformer.h.0.attn.rotary']" in message
    assert "transformer.ln_f.bias: (5,) instead of (32,)" in message


def test_an_untied_model_needs_its_lm_head(hf32):
    state = {k: v for k, v in hf32.state_dict().items() if k != "lm_head.weight"}
    with pytest.raises(CheckpointError, match=r"missing \['lm_head.weight'\]"):
        convert_gpt2_state_dict(state, gpt2_config(hf32.config), tie_word_embeddings=False)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (dict(scale_attn_by_inverse_layer_idx=True), "scale_attn_by_inverse_layer_idx"),
        (dict(activation_function="quick_gelu"), "activation_function 'quick_gelu'"),
    ],
)
def test_gpt2_variants_we_cannot_express(override, message):
    config = transformers.GPT2Config(n_layer=1, n_embd=8, n_head=2, **override)
    with pytest.raises(ValueError, match=message):
        gpt2_config(config)
