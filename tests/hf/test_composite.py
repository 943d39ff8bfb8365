"""A composite (multimodal) checkpoint imported as its language model (`hf/_composite.py`):
the text config's causal LM, verified as that causal LM, whose logits on text alone are the
composite model's. Gemma 3 (the Gemma 3 family; its file keeps the language model under
`language_model.model.`, the unembedding tied), GOT-OCR 2 (Qwen 2 by convention) and
MOSS Transcribe-Diarize (Qwen 3 by convention, an audio tower; its file keeps
`model.language_model.`), Mllama (its text model's embedding 8 rows longer than the
vocabulary, for image tokens; its causal LM named by the composite's model type). The
reference is the composite HF model on token ids alone."""

import logging

import pytest
import torch
from torch import nn

from hookedattn import HookedTransformer

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("hookedattn.core.hf")
from hookedattn.core.hf import _composite, _tiny  # noqa: E402

TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 1, 29, 77, 4, 12]])
COMPOSITES = {
    "gemma3": "Gemma3ForConditionalGeneration",
    "got_ocr2": "GotOcr2ForConditionalGeneration",
    "moss_transcribe_diarize": "MossTranscribeDiarizeForConditionalGeneration",
    "mllama": "MllamaForConditionalGeneration",
}
# Of the logits' scale in float64, as tests/hf/test_convention.py: HF's RMSNorms of these
# models compute in float32 whatever the dtype.
FLOAT64_TOLERANCE = 1e-6


def twin(model_type: str, seed: int = 0) -> nn.Module:
    """A tiny random composite model of `model_type`."""
    model_class = getattr(transformers, COMPOSITES[model_type])
    config = _tiny.tiny_config(transformers.AutoConfig.for_model(model_type))
    return _tiny.random_hf_model(model_class, config, seed=seed)


@pytest.mark.parametrize("model_type", COMPOSITES)
def test_a_live_composite_imports_its_language_model_exactly(model_type):
    reference = twin(model_type, seed=3).double()
    model = HookedTransformer.from_hf(reference)
    with torch.no_grad():
        expected = reference(TOKENS).logits
        logits = model(TOKENS)
    scale = float(expected.abs().max())
    assert float((logits - expected).abs().max()) <= FLOAT64_TOLERANCE * scale
    assert model.verification is not None or model_type == "gemma3"  # a family: not checked


@pytest.mark.parametrize("model_type", COMPOSITES)
def test_a_composite_folder_is_verified_and_read_under_its_prefix(model_type, tmp_path):
    reference = twin(model_type, seed=4)
    reference.save_pretrained(tmp_path / model_type)
    model = HookedTransformer.from_hf(tmp_path / model_type)
    assert model.verification is not None
    with torch.no_grad():
        expected = reference(TOKENS).logits
        assert float((model(TOKENS) - expected).abs().max()) <= 1e-5 * float(expected.abs().max())


def test_the_parts_left_out_are_logged(caplog):
    with caplog.at_level(logging.WARNING, logger=_composite.__name__):
        HookedTransformer.from_hf(twin("moss_transcribe_diarize"))
    assert "language model only; audio_config left out" in caplog.text


def test_the_language_model_prefix_is_the_one_most_names_fall_under():
    # A tower keeps some of the language model's names (its layers' q_proj), never all.
    inner = {"embed_tokens.weight", "layers.0.self_attn.q_proj.weight", "norm.weight"}
    stored = ["vision.encoder.layers.0.self_attn.q_proj.weight",
              "language_model.model.embed_tokens.weight",
              "language_model.model.layers.0.self_attn.q_proj.weight",
              "language_model.model.norm.weight"]  # fmt: skip
    assert _composite._prefix(inner, stored) == "language_model.model."


def test_a_composite_whose_language_model_is_refused_is_refused_by_its_part():
    # Gemma 4 attending bidirectionally over every token: its family refuses it.
    config = _tiny.tiny_config(transformers.AutoConfig.for_model("gemma4"))
    config.text_config.use_bidirectional_attention = "all"
    composite = _tiny.random_hf_model(transformers.Gemma4ForConditionalGeneration, config)
    with pytest.raises(ValueError, match=r"bidirectional attention \(use_bidirectional"):
        HookedTransformer.from_hf(composite)


def test_embedding_rows_past_the_vocabulary_are_read_but_never_an_output():
    composite = twin("mllama", seed=5)
    model = HookedTransformer.from_hf(composite)
    embed = composite.get_input_embeddings().weight
    assert (model.cfg.d_vocab, model.cfg.d_vocab_out) == (embed.shape[0], embed.shape[0] - 8)
    assert torch.equal(model.W_E, embed)
