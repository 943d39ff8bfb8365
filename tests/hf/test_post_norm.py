"""Architectures with post-residual norms (GPT-1, the BERT family, BART-likes), imported
and compared with `transformers` on tiny random twins: the logits and every layer's
residual stream in float64 (to 1e-10 of their scale) and float32 (1e-5), and greedy
generation token for token."""

import copy

import pytest
import torch
from torch import nn

from hookedattn import HookedTransformer

transformers = pytest.importorskip("transformers")
from hookedattn.core.hf import _tiny  # noqa: E402

TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29, 77, 4, 12],
                       [9, 2, 2, 31, 7, 50, 6, 13, 3, 1, 40, 22]])  # fmt: skip
ARCHITECTURES = ("openai-gpt",)


@pytest.fixture(autouse=True)
def memo(tmp_path, monkeypatch):
    """A memo of the test's own: each test verifies afresh."""
    monkeypatch.setenv("HOOKEDATTN_CACHE", str(tmp_path / "cache"))


def twin(model_type: str, seed: int = 3) -> nn.Module:
    """A tiny random causal LM of `model_type`, as the verification builds one."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    config = _tiny.tiny_config(transformers.AutoConfig.for_model(model_type))
    return _tiny.random_hf_model(model_class, config, seed=seed).eval()


def relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got - want).abs().max()) / float(want.abs().max())


@pytest.mark.parametrize("model_type", ARCHITECTURES)
@pytest.mark.parametrize(("dtype", "bound"), [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_logits_and_every_residual_stream_equal_transformers(model_type, dtype, bound):
    reference = twin(model_type).to(dtype)
    model = HookedTransformer.from_hf(reference)
    tokens = TOKENS % reference.config.vocab_size
    with torch.no_grad():
        expected = reference(tokens, output_hidden_states=True)
        logits, cache = model.run_with_cache(tokens)
    assert relative(logits, expected.logits) <= bound
    # hidden_states[0] is the stream entering the first layer, [i + 1] what layer i writes.
    assert relative(cache["blocks.0.hook_resid_pre"], expected.hidden_states[0]) <= bound
    for i in range(model.cfg.n_layers - 1):
        assert (
            relative(cache[f"blocks.{i}.hook_resid_post"], expected.hidden_states[i + 1]) <= bound
        )


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_greedy_generation_equals_transformers(model_type):
    reference = twin(model_type)
    model = HookedTransformer.from_hf(copy.deepcopy(reference))
    prompt = TOKENS[:1, :4] % reference.config.vocab_size
    for field in ("eos_token_id", "forced_eos_token_id", "forced_bos_token_id"):
        setattr(reference.generation_config, field, None)
    expected = reference.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
    ours = model.generate(prompt, max_new_tokens=6, do_sample=False, stop_at_eos=False)
    assert torch.equal(ours, expected)


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_the_import_is_post_residual(model_type):
    model = HookedTransformer.from_hf(twin(model_type))
    assert model.cfg.normalization_placement == "post_residual"
