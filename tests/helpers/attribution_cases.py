"""The tiny models and transcoder sets the attribution-graph tests build their graphs of
(tests/features/test_attribution_graph.py and its chunked twin,
test_attribution_graph_streaming.py): three model shapes, four kinds of set, every weight
moved off its initialisation so that a term the graph forgot changes its numbers."""

import torch

from hookedattn.sae import (
    CrossLayerTranscoder,
    CrossLayerTranscoderConfig,
    Transcoder,
    TranscoderConfig,
)
from hookedattn.testing import random_tiny_model, random_tokens

TOKENS = random_tokens(32, 1, 9, seed=5)[0]
MODELS = {
    "LN": dict(),
    "RMS, rotary, grouped": dict(normalization_type="RMS", positional_embedding_type="rotary",
                                 n_key_value_heads=2, rotary_dim=4),
    "no norms": dict(normalization_type=None),
}  # fmt: skip


def model_of(kind: str):
    """A random tiny model of shape `kind` (a key of `MODELS`)."""
    return random_tiny_model(act_fn="gelu", n_ctx=12, **MODELS[kind])


def jiggled(module, seed=3):
    """`module` with every parameter moved by seeded noise (thresholds kept non-negative)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
            if name.endswith("threshold"):
                p.abs_()
    return module


def per_layer(activation="relu", skip=False, reads="ln2.hook_out"):
    """One float64 transcoder per layer of the 2-layer model, reading `blocks.L.<reads>`."""
    k = {"k": 6} if activation == "topk" else {}
    return [jiggled(Transcoder(TranscoderConfig(
        16, 48, 16, f"blocks.{layer}.{reads}", f"blocks.{layer}.hook_mlp_out", activation,
        skip=skip, dtype="float64", **k)), seed=layer)
        for layer in range(2)]  # fmt: skip


def cross_layer(activation="topk", reads="ln2.hook_out"):
    """A float64 cross-layer transcoder over the 2-layer model, reading `blocks.L.<reads>`."""
    k = {"k": 6} if activation == "topk" else {}
    cfg = CrossLayerTranscoderConfig(2, 16, 48, 16, activation, feature_input_hook=reads,
                                     dtype="float64", **k)  # fmt: skip
    return jiggled(CrossLayerTranscoder(cfg))


SETS = {
    "relu": lambda reads: per_layer("relu", reads=reads),
    "skip topk": lambda reads: per_layer("topk", True, reads=reads),
    "jumprelu": lambda reads: per_layer("jumprelu", reads=reads),
    "cross-layer topk": lambda reads: cross_layer("topk", reads=reads),
}


def reads_of(model_kind: str) -> str:
    """Where the transcoders read: the MLP's input, or the stream where there is no norm."""
    return "hook_resid_mid" if model_kind == "no norms" else "ln2.hook_out"


def build(model_kind, set_kind):
    """The model of `model_kind` and the set of `set_kind` (a key of `SETS`) that fits it."""
    model = model_of(model_kind)
    return model, SETS[set_kind](reads_of(model_kind))
