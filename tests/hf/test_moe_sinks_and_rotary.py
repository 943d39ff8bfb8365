"""The attention pieces the newest families brought: sinks (GPT-OSS), YaRN rotary (GPT-OSS)
and a local rotary of its own (Gemma 3).

Sinks: the fused kernel has none, so they are folded into its call as one more key; that
path, the written-out one (hook points attached) and a softmax written here against the
sink formula must agree, with grouped keys and values, windows, padding and a KV cache.
The frequencies are compared with transformers' own functions (`ROPE_INIT_FUNCTIONS`).
"""

import pytest
import torch

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.core.components.rotary import rotary_attention_factor, rotary_frequencies
from hookedattn.testing.models import randomize_parameters

SINKS = dict(
    n_layers=2, d_model=16, n_heads=4, d_head=4, n_key_value_heads=2, n_ctx=24, d_vocab=23,
    d_mlp=8, gated_mlp=True, act_fn="silu", normalization_type="RMS",
    positional_embedding_type="rotary", use_attn_sinks=True, window_size=3,
    attn_types=("local", "global"), dtype="float64", seed=0,
)  # fmt: skip
TOKENS = torch.randint(0, 23, (2, 9), generator=torch.Generator().manual_seed(0))


def sink_model(**overrides) -> HookedTransformer:
    cfg = HookedTransformerConfig(**{**SINKS, **overrides})
    return randomize_parameters(HookedTransformer(cfg), scale=1.0, seed=2)


def written_out(model, *args, **kwargs):
    """The forward with every pattern hooked: the attention written out, not fused."""
    hooks = [(f"blocks.{layer}.attn.hook_pattern", lambda p, hook: None) for layer in (0, 1)]
    return model.run_with_hooks(*args, fwd_hooks=hooks, **kwargs)


@pytest.mark.parametrize("padded", [False, True])
def test_the_fused_sink_kernel_equals_the_written_out_sinks(padded):
    model = sink_model()
    mask = torch.ones_like(TOKENS)
    if padded:
        mask[0, :3] = 0
    with torch.no_grad():
        fused = model(TOKENS, attention_mask=mask)
        by_hand = written_out(model, TOKENS, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(fused[real], by_hand[real], rtol=0, atol=1e-12)


def test_a_generation_step_with_sinks_equals_the_whole_sequence():
    model = sink_model()
    with torch.no_grad():
        tokens = model.generate(TOKENS[:, :4], max_new_tokens=5, do_sample=False, stop_at_eos=False)
        whole = model(tokens[:, :-1])
        written = written_out(model, tokens[:, :-1])
    assert torch.equal(tokens[:, -5:], whole[:, -5:].argmax(-1))
    torch.testing.assert_close(whole, written, rtol=0, atol=1e-12)


def test_the_sink_pattern_is_the_softmax_with_one_more_logit():
    model = sink_model()
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
    for layer in (0, 1):
        scores, pattern = cache["attn_scores", layer], cache["pattern", layer]
        sinks = model.blocks[layer].attn.sinks
        exp = scores.exp()  # blocked scores are -inf: exp 0
        expected = exp / (exp.sum(-1, keepdim=True) + sinks.exp()[None, :, None, None])
        torch.testing.assert_close(pattern, expected, rtol=0, atol=1e-12)
        rows = pattern.sum(-1)
        # at most 1 (to float64 rounding: a row whose sink is negligible sums to 1 + 1 ulp)
        assert bool((rows <= 1 + 1e-12).all()) and bool((rows < 0.99).any())


def test_without_sinks_the_model_has_no_sink_parameter():
    model = sink_model(use_attn_sinks=False)
    assert model.blocks[0].attn.sinks is None
    assert not any("sinks" in name for name in model.state_dict())


transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize(
    "rope",
    [
        dict(factor=32.0, beta_fast=32.0, beta_slow=1.0, truncate=False),
        dict(factor=4.0, beta_fast=8.0, beta_slow=2.0),  # truncated band edges (HF's default)
        dict(factor=8.0, mscale=1.0, mscale_all_dim=0.5),  # DeepSeek's attention factor
    ],
)
def test_yarn_frequencies_and_attention_factor_equal_hfs(rope):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from hookedattn.core.hf import _translate

    config = transformers.GptOssConfig(
        hidden_size=64, head_dim=16, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=256,
        rope_parameters=dict(rope_type="yarn", rope_theta=1e4,
                             original_max_position_embeddings=64, **rope),
    )  # fmt: skip
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS["yarn"](config)
    fields = _translate.rotary(config, 16, yarn=True)
    cfg = HookedTransformerConfig(n_layers=1, d_model=64, n_ctx=256, d_vocab=8, d_head=16,
                                  attn_only=True, **fields)  # fmt: skip
    assert torch.equal(rotary_frequencies(cfg), inv_freq)
    assert rotary_attention_factor(cfg) == pytest.approx(attention_factor, rel=1e-15)


def test_local_layers_rotate_by_their_own_base_and_global_ones_keep_theirs():
    cfg = HookedTransformerConfig(
        n_layers=2, d_model=16, n_ctx=16, d_vocab=8, d_head=8, attn_only=True,
        positional_embedding_type="rotary", rotary_base=1e6, rotary_scaling_factor=8.0,
        rotary_base_local=1e4, window_size=4, attn_types=("local", "global"),
    )  # fmt: skip
    model = HookedTransformer(cfg)
    exponents = torch.arange(0, 8, 2).float() / 8
    local, global_ = model.blocks[0].attn.rotary, model.blocks[1].attn.rotary
    assert torch.equal(local.inv_freq, 1.0 / (1e4**exponents))
    assert torch.equal(global_.inv_freq, 1.0 / (1e6**exponents) / 8.0)
