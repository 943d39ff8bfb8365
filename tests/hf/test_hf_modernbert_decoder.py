"""ModernBERT-decoder (`ModernBertDecoderForCausalLM`) imported by convention: its
embeddings normed (`embeddings.norm`), its first layer's attention reading them without a
norm of its own (`attn_norm` an identity: `ln1_layers`, `_first_layer`), global and
sliding-window layers with rotary bases of their own, a fused `Wi` gated MLP, and a
prediction head, `norm(act(dense(x)))` without a bias, before the decoder (`_head`).
Compared with `transformers` on tiny random twins: the logits and every residual stream in
float32 and float64 (transformers computes its rotary's angles in float32 in either dtype:
float32's rounding bounds both), and greedy generation."""

import pytest
import torch
from helpers.generation import greedy_ours_and_transformers
from helpers.twins import streams_worst
from torch import nn

from hookedattn import HookedTransformer
from hookedattn.core.components.norm import NoNorm

transformers = pytest.importorskip("transformers")
from hookedattn.core.hf import _tiny  # noqa: E402

TOKENS = torch.tensor(
    [[5, 17, 3, 42, 8, 8, 60, 1, 29, 77, 4, 12], [9, 2, 2, 71, 30, 6, 5, 14, 100, 3, 3, 50]]
)


def twin(seed: int = 0, **fields) -> nn.Module:
    """A tiny random ModernBERT-decoder, as the verification builds one, with `fields` set."""
    config = transformers.AutoConfig.for_model("modernbert-decoder", **fields)
    model_class = transformers.ModernBertDecoderForCausalLM
    return _tiny.random_hf_model(model_class, _tiny.tiny_config(config), seed=seed)


def test_its_first_block_reads_the_normed_embeddings_without_a_norm():
    model = HookedTransformer.from_hf(twin(seed=3))
    assert model.cfg.ln1_layers == (False,) + (True,) * (model.cfg.n_layers - 1)
    assert isinstance(model.blocks[0].ln1, NoNorm)
    assert not isinstance(model.blocks[1].ln1, NoNorm)
    assert model.cfg.embed_norm and model.cfg.unembed_transform == "gelu"
    assert "local" in model.cfg.attn_types and "global" in model.cfg.attn_types


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("fields", [{}, {"classifier_bias": True, "num_hidden_layers": 4}])
def test_modernbert_decoder_computes_what_transformers_computes(dtype, fields):
    reference = twin(seed=3, **fields).to(dtype)
    model = HookedTransformer.from_hf(reference)
    assert streams_worst(model, reference, TOKENS) <= 1e-5


def test_modernbert_decoder_greedy_generation_is_transformers():
    assert torch.equal(*greedy_ours_and_transformers(twin(seed=4), TOKENS[:, :5]))


def test_a_first_layer_missing_another_norm_is_refused_by_name():
    import dataclasses

    from hookedattn.core.hf import _anatomy, _first_layer

    anatomy = _anatomy.recognise(twin().config, "ModernBertDecoderForCausalLM")
    assert anatomy.first_identities == ("attn_norm",)
    other = dataclasses.replace(anatomy, first_identities=("mlp_norm",))
    with pytest.raises(ValueError, match=r"identity in place of \['mlp_norm'\]"):
        _first_layer.ln1_fields(other, 2)
