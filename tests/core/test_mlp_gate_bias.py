"""A dense gated MLP whose gate has a bias (`mlp_gate_bias`, RecurrentGemma's):
`act(x @ W_gate + b_gate) * (x @ W_in + b_in)` before `W_out`. Checked in float64 against
the MLP written out by hand; the identities of the stream hold, and folding a LayerNorm's
bias into the gate (which a gate without a bias refuses) keeps the log-probabilities."""

import pytest
import torch

from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.testing.identities import assert_residual_identities
from hookedattn.testing.models import randomize_parameters

BASE = dict(
    n_layers=2, d_model=16, n_heads=4, d_head=4, n_ctx=16, d_vocab=23, d_mlp=12,
    gated_mlp=True, mlp_gate_bias=True, act_fn="gelu_new", normalization_type="RMS",
    positional_embedding_type="rotary", dtype="float64", seed=0,
)  # fmt: skip
TOKENS = torch.randint(0, 23, (2, 7), generator=torch.Generator().manual_seed(4))


def _model(**overrides) -> HookedTransformer:
    cfg = HookedTransformerConfig(**{**BASE, **overrides})
    return randomize_parameters(HookedTransformer(cfg), scale=0.5, seed=2)


def test_the_gate_reads_its_bias() -> None:
    model = _model()
    _, cache = model.run_with_cache(TOKENS)
    mlp = model.blocks[0].mlp
    x = cache["blocks.0.ln2.hook_out"]
    pre = x @ mlp.W_gate + mlp.b_gate
    gate = torch.nn.functional.gelu(pre, approximate="tanh")
    want = (gate * (x @ mlp.W_in + mlp.b_in)) @ mlp.W_out + mlp.b_out
    torch.testing.assert_close(cache["blocks.0.mlp.hook_pre"], pre, rtol=0, atol=1e-12)
    torch.testing.assert_close(cache["blocks.0.hook_mlp_out"], want, rtol=0, atol=1e-12)


def test_the_stream_identities_hold() -> None:
    model = _model()
    _, cache = model.run_with_cache(TOKENS)
    assert_residual_identities(model, cache)


def test_a_layer_norm_bias_folds_into_the_gate_bias() -> None:
    from hookedattn.core import processing

    model = _model(normalization_type="LN")
    processed = processing.process_weights(model)
    expected = model(TOKENS).log_softmax(-1)
    torch.testing.assert_close(processed(TOKENS).log_softmax(-1), expected, rtol=0, atol=1e-10)


def test_a_gate_bias_needs_a_dense_gated_mlp() -> None:
    with pytest.raises(ValueError, match="mlp_gate_bias is the bias of a dense gated MLP"):
        HookedTransformerConfig(**{**BASE, "gated_mlp": False})
