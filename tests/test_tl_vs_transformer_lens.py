"""hookedattn_tl against TransformerLens itself, on the same random weights (optional).

Skipped unless `transformer_lens` is importable; it is never a dependency of the suite.
To run it, install TransformerLens beside hookedattn in a separate environment
(`pip install -c constraints.txt transformer_lens==3.5.1 pytest beartype`) and run this file
there with the repository on `PYTHONPATH`.

Two checks: every activation of a cache, and every number of the Main-Demo-style script
(tests/tl_main_demo.py) run unchanged under TransformerLens and, with its import changed,
under hookedattn_tl.
"""

import pytest
import torch
from torch.testing import assert_close

transformer_lens = pytest.importorskip("transformer_lens")

import hookedattn_tl  # noqa: E402

# float32 forwards of two implementations: their rounding differs, not their math.
TOLERANCE = dict(atol=2e-5, rtol=2e-5)


# Families both implement; the gated MLP without b_in: TransformerLens 3.5 adds b_in after
# the gate's product (`act(x W_gate) * (x W_in) + b_in`), we inside it (`act(x W_gate) *
# (x W_in + b_in)`, as `hook_pre_linear` says); Llama-style models have no b_in.
VARIANTS = {
    "default": {},
    "attn_only": dict(attn_only=True),
    "rms": dict(normalization_type="RMS"),
    "no_norm": dict(normalization_type=None),
    "grouped_query": dict(n_key_value_heads=2),
    "rotary": dict(positional_embedding_type="rotary", rotary_dim=8),
    "parallel": dict(parallel_attn_mlp=True),
    "gated_silu": dict(gated_mlp=True, act_fn="silu", normalization_type="RMS"),
}


def random_weights(config: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Every parameter drawn at random, biases and gains too, so that every term matters."""
    model = hookedattn_tl.HookedTransformer(hookedattn_tl.HookedTransformerConfig(**config))
    generator = torch.Generator().manual_seed(seed)
    weights = {
        name: torch.randn(t.shape, generator=generator) * 0.3 + name.endswith(".w")
        for name, t in model.state_dict().items()
    }
    if config.get("gated_mlp"):
        weights = {n: t * 0 if n.endswith("mlp.b_in") else t for n, t in weights.items()}
    return weights


def tl_model(weights: dict[str, torch.Tensor], config: dict):
    model = transformer_lens.HookedTransformer(transformer_lens.HookedTransformerConfig(**config))
    missing, unexpected = model.load_state_dict(weights, strict=False)
    parameters = {name for name, _ in model.named_parameters()}
    assert not parameters & set(missing), "a TransformerLens parameter was not loaded"
    assert not unexpected
    return model.eval()


def our_model(weights: dict[str, torch.Tensor], config: dict) -> hookedattn_tl.HookedTransformer:
    model = hookedattn_tl.HookedTransformer(hookedattn_tl.HookedTransformerConfig(**config))
    model.load_state_dict(weights)
    return model.eval()


def run_demo(main_demo, source: str, weights: dict[str, torch.Tensor]) -> dict:
    namespace = {"weights": weights, "config": main_demo.config}
    exec(compile(source, str(main_demo.path), "exec"), namespace)
    return namespace["results"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_cached_activation_matches(variant, main_demo):
    config = {**main_demo.config, **VARIANTS[variant]}
    weights = random_weights(config)
    tokens = torch.randint(
        0, config["d_vocab"], (3, 10), generator=torch.Generator().manual_seed(1)
    )
    theirs_logits, theirs = tl_model(weights, config).run_with_cache(tokens)
    ours_logits, ours = our_model(weights, config).run_with_cache(tokens)
    assert_close(ours_logits, theirs_logits, **scaled(theirs_logits))
    compared = list(theirs)
    assert set(compared) <= set(ours.keys())
    for name in compared:
        expected = theirs[name]
        assert_close(ours[name], expected, **scaled(expected), msg=lambda m, n=name: f"{n}: {m}")


def scaled(expected: torch.Tensor) -> dict[str, float]:
    """TOLERANCE, its absolute part relative to the tensor's largest entry: without norms
    the stream grows to hundreds, and float32 rounding grows with it."""
    largest = max(1.0, float(expected.abs().max()))
    return dict(atol=TOLERANCE["atol"] * largest, rtol=TOLERANCE["rtol"])


def test_main_demo_gives_transformer_lens_numbers(main_demo):
    weights = random_weights(main_demo.config)
    theirs = run_demo(main_demo, main_demo.source, weights)
    ours = run_demo(main_demo, main_demo.ported, weights)
    assert ours.pop("version_module") == "hookedattn_tl"
    assert theirs.pop("version_module") == "transformer_lens"
    assert set(ours) == set(theirs)
    for key, value in theirs.items():
        if isinstance(value, torch.Tensor):
            assert_close(
                ours[key].float(), value.float(), **TOLERANCE, msg=lambda m, k=key: f"{k}: {m}"
            )
        elif isinstance(value, float):
            assert ours[key] == pytest.approx(value, rel=1e-5, abs=1e-5), key
        else:
            assert ours[key] == value, key


@pytest.mark.parametrize("mode", ["Q", "K", "V"])
def test_all_composition_scores_match(mode, main_demo):
    config = main_demo.config
    weights = random_weights(config)
    theirs = tl_model(weights, config).all_composition_scores(mode)
    ours = our_model(weights, config).all_composition_scores(mode)
    assert_close(ours, theirs, **TOLERANCE)
