"""ELECTRA and RemBERT imported by convention: embeddings narrower than the stream, normed at
their width and projected into it (`embed_proj`), and a head whose dense map goes to the
width the decoder reads (`d_unembed`). Each tiny random twin (`_tiny`: embeddings 40 wide,
RemBERT's output side 24, the stream 64) is compared with `transformers` in float32 and
float64: the logits, every residual stream, the embedding's own hook points at their
narrow width; and greedy generation.
"""

import pytest
import torch
from helpers.generation import greedy_ours_and_transformers
from helpers.twins import relative_worst
from torch import nn

from hookedattn import HookedTransformer

transformers = pytest.importorskip("transformers")
from hookedattn.core.hf import _tiny  # noqa: E402

TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29, 77], [9, 2, 2, 71, 30, 6, 5, 14, 100, 3]])
# model type -> (its causal LM, its base model's attribute, the twin's d_embed, d_unembed)
ARCHITECTURES = {
    "electra": ("ElectraForCausalLM", "electra", 40, 40),
    "rembert": ("RemBertForCausalLM", "rembert", 40, 24),
}


def twin(model_type: str, seed: int = 0, **fields) -> nn.Module:
    """A tiny random decoder of `model_type`, as the verification builds one."""
    config = transformers.AutoConfig.for_model(model_type, is_decoder=True, **fields)
    model_class = getattr(transformers, ARCHITECTURES[model_type][0])
    return _tiny.random_hf_model(model_class, _tiny.tiny_config(config), seed=seed)


@pytest.mark.parametrize("model_type", ARCHITECTURES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_import_computes_what_transformers_computes(model_type, dtype):
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5  # of each tensor's largest value
    reference = twin(model_type, seed=3).to(dtype)
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        expected = reference(TOKENS, output_hidden_states=True)
        logits, cache = model.run_with_cache(TOKENS)
    assert relative_worst(logits, expected.logits) <= tolerance
    for i in range(model.cfg.n_layers):  # the projected stream entering each layer
        got, want = cache[f"blocks.{i}.hook_resid_pre"], expected.hidden_states[i]
        assert relative_worst(got, want) <= tolerance
    last = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"]
    assert relative_worst(last, expected.hidden_states[-1]) <= tolerance


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_the_widths_and_the_narrow_hook_points_are_transformers(model_type):
    _, base, d_embed, d_unembed = ARCHITECTURES[model_type]
    reference = twin(model_type, seed=5).double()
    model = HookedTransformer.from_hf(reference)
    assert (model.cfg.d_model, model.cfg.d_embed, model.cfg.d_unembed) == (64, d_embed, d_unembed)
    embeddings = getattr(reference, base).embeddings
    with torch.no_grad():
        _, cache = model.run_with_cache(TOKENS)
        want_embed = embeddings.word_embeddings(TOKENS)
        want_normed = embeddings(TOKENS)  # summed with positions and token type 0, normed
    torch.testing.assert_close(cache["hook_embed"], want_embed, rtol=0, atol=0)
    torch.testing.assert_close(cache["ln_embed.hook_out"], want_normed, rtol=0, atol=1e-12)


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_greedy_generation_is_transformers(model_type):
    assert torch.equal(*greedy_ours_and_transformers(twin(model_type, seed=4), TOKENS[:, :5]))


def test_electra_as_wide_as_its_stream_has_no_projection():
    reference = twin("electra", seed=6, embedding_size=256, hidden_size=256).double()
    model = HookedTransformer.from_hf(reference)
    assert model.cfg.d_embed is None and model.cfg.d_unembed is None
    with torch.no_grad():
        assert relative_worst(model(TOKENS), reference(TOKENS).logits) <= 1e-12


def test_each_side_of_rembert_is_read_by_its_own_field_where_the_widths_are_equal():
    from hookedattn.core.hf._projections import width_field

    config = transformers.RemBertConfig(input_embedding_size=40, output_embedding_size=40)
    assert width_field(config, 40, "input", "the embeddings'") == "input_embedding_size"
    assert width_field(config, 40, "output", "the head's") == "output_embedding_size"


def test_a_width_no_config_field_holds_is_refused_by_name():
    from hookedattn.core.hf._projections import width_field

    config = transformers.ElectraConfig(embedding_size=40, hidden_size=64)
    with pytest.raises(ValueError, match=r"the embeddings' width 48 is named by no field"):
        width_field(config, 48, "input", "the embeddings'")
