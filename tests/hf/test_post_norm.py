"""Architectures with post-residual norms (GPT-1, the BERT family, BART-likes) and the
BERT-likes' pre-norm variants, imported and compared with `transformers` on tiny random
twins: the logits and every layer's residual stream in float64 (to 1e-10 of their scale)
and float32 (1e-5), and greedy generation token for token.

The tokens avoid RoBERTa's padding id (1): RoBERTa-likes give a padding token no position
of its own, which an imported model, counting every position, does not copy."""

import copy

import pytest
import torch
from torch import nn

from hookedattn import HookedTransformer

transformers = pytest.importorskip("transformers")
from hookedattn.core.hf import _tiny  # noqa: E402

TOKENS = torch.tensor([[5, 17, 3, 42, 8, 8, 60, 11, 29, 77, 4, 12],
                       [9, 21, 20, 31, 7, 50, 6, 13, 3, 14, 40, 22]])  # fmt: skip
POST_RESIDUAL = ("openai-gpt", "bert", "bert-generation", "ernie", "roberta", "camembert",
                 "xlm-roberta", "data2vec-text",
                 "bart", "mvp", "plbart", "trocr", "marian")  # fmt: skip
# Pre-norm relatives with an embedding norm (and BERT's head transform).
PRE_NORM = ("megatron-bert", "roberta-prelayernorm", "xlm-roberta-xl", "mbart")
ARCHITECTURES = POST_RESIDUAL + PRE_NORM


def twin(model_type: str, seed: int = 3, decoder: bool = True) -> nn.Module:
    """A tiny random causal LM of `model_type`, as the verification builds one."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    config = _tiny.tiny_config(transformers.AutoConfig.for_model(model_type))
    if hasattr(config, "is_decoder"):  # BERT-likes are causal LMs as decoders only
        config.is_decoder = decoder
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


# RoBERTa-likes, whose positions start at row `padding_idx + 1` of their table: HF's
# `generate` feeds them position ids from 0 (`_prepare_position_ids_for_generation`), which
# their own forward never does, so theirs is compared with greedy decoding by that forward.
ROBERTA_LIKE = ("roberta", "camembert", "xlm-roberta", "data2vec-text",
                "roberta-prelayernorm", "xlm-roberta-xl")  # fmt: skip


def greedy(reference: nn.Module, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """`n` greedy tokens by HF's forward on the whole sequence so far, step by step."""
    tokens = prompt
    with torch.no_grad():
        for _ in range(n):
            next_token = reference(tokens).logits[:, -1:].argmax(-1)
            tokens = torch.cat([tokens, next_token], dim=1)
    return tokens


@pytest.mark.parametrize("model_type", ARCHITECTURES)
def test_greedy_generation_equals_transformers(model_type):
    reference = twin(model_type)
    model = HookedTransformer.from_hf(copy.deepcopy(reference))
    prompt = TOKENS[:1, :4] % reference.config.vocab_size
    ours = model.generate(prompt, max_new_tokens=6, do_sample=False, stop_at_eos=False)
    assert torch.equal(ours, greedy(reference, prompt, 6))
    if model_type not in ROBERTA_LIKE:
        for field in ("eos_token_id", "forced_eos_token_id", "forced_bos_token_id"):
            setattr(reference.generation_config, field, None)
        expected = reference.generate(prompt, max_new_tokens=6, do_sample=False, pad_token_id=0)
        assert torch.equal(ours, expected)


@pytest.mark.parametrize(
    ("model_type", "placement"), [("openai-gpt", "post_residual"), ("bert", "post_residual"),
                                  ("bart", "post_residual"), ("megatron-bert", "pre"),
                                  ("mbart", "pre")])  # fmt: skip
def test_the_import_places_the_norms_where_the_architecture_does(model_type, placement):
    assert HookedTransformer.from_hf(twin(model_type)).cfg.normalization_placement == placement


def test_a_bert_decoder_has_an_embedding_norm_and_a_head_transform():
    model = HookedTransformer.from_hf(twin("bert"))
    assert model.cfg.embed_norm and model.cfg.unembed_transform == "gelu"


def test_a_bart_decoder_has_an_embedding_norm_and_no_final_norm():
    model = HookedTransformer.from_hf(twin("bart"))
    assert model.cfg.embed_norm and model.cfg.unembed_transform is None
    assert "ln_final.hook_scale" not in model.hook_dict


def test_a_bert_that_is_not_a_decoder_is_refused_naming_why():
    with pytest.raises(ValueError, match="is_decoder=False"):
        HookedTransformer.from_hf(twin("bert", decoder=False))


def test_the_anatomy_round_trips_through_the_memo_and_old_entries_still_load():
    import dataclasses
    import json

    from hookedattn.core.hf import _anatomy, _recognised

    anatomy = _anatomy.recognise(twin("bert").config)
    stored = json.loads(json.dumps(dataclasses.asdict(anatomy)))
    assert _recognised.from_json(stored) == anatomy
    new = ("embed_norm", "token_types", "positions_within", "head_dense", "head_norm", "head_act")
    before = _recognised.from_json({k: v for k, v in stored.items() if k not in new})
    assert before.embed_norm is None and before.head_act is None


@pytest.mark.parametrize("model_type", ["openai-gpt", "bart"])
def test_an_imported_model_decomposes_exactly_through_its_frozen_norms(model_type):
    from analysis import decompose_resid, direct_logit_attribution

    model = HookedTransformer.from_hf(twin(model_type).double())
    tokens = TOKENS % model.cfg.d_vocab
    logits, cache = model.run_with_cache(tokens)
    for layer in range(model.cfg.n_layers):
        decompose_resid(model, cache, layer=layer, site="resid_mid", check=True)
    attribution = direct_logit_attribution(model, cache, decompose_resid(model, cache), tokens=5)
    torch.testing.assert_close(attribution.total(), logits[..., 5], rtol=0, atol=1e-10)
