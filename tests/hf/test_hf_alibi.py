"""ALiBi architectures imported by convention (BLOOM, MPT): the linear bias each attention is
handed is recognised on the tiny twin (`_alibi`), and the checkpoint's own slopes, as
`transformers` rounds them, are read off a twin with its head count.

The reference is the HF model itself. BLOOM's softmax is computed in float32 whatever the
model's dtype, and its GELU's constant has 8 digits; here both are float64's
(`bloom_float64_math`), so the two agree to float64's rounding. MPT casts its scores to
float32 before its softmax, inside its attention, so it is compared with stock float64 HF
(its float32 softmax bounds the agreement).
"""

import types

import pytest
import torch
from torch import nn

from hookedattn import HookedTransformer

transformers = pytest.importorskip("transformers")
from hookedattn.core.hf import _alibi, _tiny  # noqa: E402

TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29, 77, 4, 12], [9, 2, 33, 7, 7, 1, 50, 61,
                                                                   3, 3, 19, 40]])  # fmt: skip


def twin(model_type: str, seed: int = 3, **changes) -> nn.Module:
    """A tiny random model of `model_type` (its config changed by `changes`)."""
    config = transformers.AutoConfig.for_model(model_type, **changes)
    model_class = {"bloom": transformers.BloomForCausalLM, "mpt": transformers.MptForCausalLM}
    return _tiny.random_hf_model(model_class[model_type], _tiny.tiny_config(config), seed=seed)


@pytest.fixture
def memo(tmp_path, monkeypatch):
    """A memo of the test's own: nothing another test read is remembered."""
    monkeypatch.setenv("HOOKEDATTN_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def bloom_float64_math(monkeypatch):
    """BLOOM's softmax in the scores' own dtype (it asks for float32), and its tanh GELU with
    `sqrt(2 / pi)` to float64's precision (it writes 0.79788456: 1e-10 off in float64)."""
    from transformers.models.bloom import modeling_bloom

    functional = types.SimpleNamespace(**vars(torch.nn.functional))
    functional.softmax = lambda x, dim, dtype=None: x.softmax(dim)
    monkeypatch.setattr(modeling_bloom, "F", functional)
    gelu = lambda x: torch.nn.functional.gelu(x, approximate="tanh")
    monkeypatch.setattr(modeling_bloom, "bloom_gelu_forward", gelu)


def test_bloom_in_float64_agrees_to_its_rounding(bloom_float64_math):
    reference = twin("bloom").double()
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        expected = reference(TOKENS, output_hidden_states=True, output_attentions=True)
        logits, cache = model.run_with_cache(TOKENS)
    assert model.cfg.positional_embedding_type == "alibi"
    torch.testing.assert_close(logits, expected.logits, rtol=0, atol=1e-10)
    for i in range(model.cfg.n_layers):
        torch.testing.assert_close(cache["pattern", i], expected.attentions[i], rtol=0, atol=1e-12)
        got, want = cache[f"blocks.{i}.hook_resid_pre"], expected.hidden_states[i]
        torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


def test_mpt_in_float64_agrees_to_its_float32_softmax():
    reference = twin("mpt").double()
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        expected = reference(TOKENS).logits
        logits = model(TOKENS)
    assert model.cfg.positional_embedding_type == "alibi"
    assert float((logits - expected).abs().max()) <= 1e-6 * float(expected.abs().max())


@pytest.mark.parametrize("model_type", ["bloom", "mpt"])
def test_greedy_generation_with_the_kv_cache_equals_transformers(model_type):
    reference = twin(model_type)
    model = HookedTransformer.from_hf(reference)
    prompt = TOKENS[:, :5]
    kwargs = dict(max_new_tokens=8, do_sample=False)
    expected = reference.generate(prompt, attention_mask=torch.ones_like(prompt), **kwargs)
    got = model.generate(prompt, stop_at_eos=False, **kwargs)
    assert torch.equal(got, expected)


def test_a_left_padded_bloom_prompt_agrees_with_transformers(bloom_float64_math):
    reference = twin("bloom").double()
    model = HookedTransformer.from_hf(reference)
    tokens = torch.cat([torch.zeros(1, 3, dtype=torch.long), TOKENS[:1, :9]], dim=1)
    mask = torch.cat([torch.zeros(1, 3), torch.ones(1, 9)], dim=1).long()
    with torch.no_grad():
        expected = reference(tokens, attention_mask=mask).logits[:, 3:]
        got = model(tokens, attention_mask=mask)[:, 3:]
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


@pytest.mark.parametrize("model_type", ["bloom", "mpt"])
def test_the_checkpoints_slopes_are_transformers_own_for_its_head_count(model_type):
    # 12 heads: BLOOM's powers of a float32 base and MPT's 1 / 2 ** x differ in the last bit.
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor

    width = {"bloom": "hidden_size", "mpt": "d_model"}[model_type]
    heads = {"bloom": "n_head", "mpt": "n_heads"}[model_type]
    config = transformers.AutoConfig.for_model(model_type, **{heads: 12, width: 96})
    attention = {"bloom": "transformer.h.0.self_attention", "mpt": "transformer.blocks.0.attn"}
    slopes = _alibi.fields(config, type(twin(model_type)).__name__, attention[model_type])
    expected = (
        _get_alibi_slopes(12, "cpu")
        if model_type == "bloom"
        else -build_mpt_alibi_tensor(12, 2)[:, 0, 0].float()
    )
    assert slopes["alibi_slopes"] == tuple(float(s) for s in expected)


def test_the_slopes_are_read_once_per_checkpoint_structure(memo, monkeypatch):
    config = transformers.AutoConfig.for_model("bloom", n_head=12, hidden_size=96)
    name, attention = "BloomForCausalLM", "transformer.h.0.self_attention"
    first = _alibi.fields(config, name, attention)

    def no_twin(*args):
        raise AssertionError("a second twin was built for slopes already read")

    monkeypatch.setattr(_alibi, "checkpoint_slopes", no_twin)
    assert _alibi.fields(config, name, attention) == first
    other = transformers.AutoConfig.for_model("bloom", n_head=6, hidden_size=96)
    with pytest.raises(AssertionError, match="a second twin"):
        _alibi.fields(other, name, attention)


def test_queries_keys_and_values_clipped_are_refused():
    reference = twin("mpt", attn_config={"clip_qkv": 6.0})
    with pytest.raises(ValueError, match=r"clip_qkv=6.0: queries, keys and values clamped"):
        HookedTransformer.from_hf(reference)
