"""Feature decompositions at a spliced SAE: exact sums to the stream and to the logits."""

import pytest
import torch

from analysis.features import feature_decomposition, feature_logit_attribution
from analysis.resid_stack import DecompositionError
from hookedattn import HookedTransformer, HookedTransformerConfig
from hookedattn.sae import SAEConfig, SparseAutoencoder


def tiny_model(**kw) -> HookedTransformer:
    cfg = dict(n_layers=2, d_model=16, n_ctx=8, d_head=4, n_heads=4, d_vocab=20,
               act_fn="gelu", d_mlp=32, dtype=torch.float64, seed=0)  # fmt: skip
    return HookedTransformer(HookedTransformerConfig(**{**cfg, **kw}))


def random_sae(point: str, d_in: int = 16, d_sae: int = 40) -> SparseAutoencoder:
    sae = SparseAutoencoder(SAEConfig(d_in, d_sae, point, dtype="float64", seed=2))
    with torch.no_grad():
        sae.b_enc.add_(0.1)
        sae.b_dec.normal_(generator=torch.Generator().manual_seed(5))
    return sae


TOKENS = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(0))


def spliced_run(model, sae, tokens, use_error_term=True):
    with model.saes([sae], use_error_term=use_error_term):
        return model.run_with_cache(tokens)


@pytest.mark.parametrize(
    "point", ["blocks.0.hook_resid_pre", "blocks.1.hook_resid_mid", "blocks.1.hook_resid_post"]
)
@pytest.mark.parametrize("use_error_term", [True, False])
def test_features_sum_to_the_stream(point, use_error_term):
    model, sae = tiny_model(), random_sae(point)
    _, cache = spliced_run(model, sae, TOKENS, use_error_term)
    decomp = feature_decomposition(model, cache, sae, check=True)
    assert decomp.labels[-2:] == ("sae_b_dec", "sae_error")
    torch.testing.assert_close(decomp.components.sum(0), cache[point], rtol=0, atol=1e-10)
    acts = cache[f"{point}.sae.hook_acts"]
    f = int(decomp.labels[0][1:])
    torch.testing.assert_close(decomp[decomp.labels[0]], acts[..., f, None] * sae.W_dec[f])
    error = cache[f"{point}.sae.hook_error"]
    expected_error = error if use_error_term else torch.zeros_like(error)
    torch.testing.assert_close(decomp["sae_error"], expected_error, rtol=0, atol=1e-12)


def test_inactive_features_get_no_term():
    model, sae = tiny_model(), random_sae("blocks.1.hook_resid_pre")
    with torch.no_grad():
        sae.b_enc[:20] = -1e3  # these never fire
    _, cache = spliced_run(model, sae, TOKENS)
    labels = feature_decomposition(model, cache, sae).labels
    assert not {f"F{f}" for f in range(20)} & set(labels) and "F30" in labels


@pytest.mark.parametrize("granularity", ["sublayer", "head"])
@pytest.mark.parametrize("point", ["blocks.1.hook_resid_pre", "blocks.1.hook_resid_post"])
def test_feature_logit_attribution_sums_to_the_logits(point, granularity):
    model, sae = tiny_model(), random_sae(point)
    logits, cache = spliced_run(model, sae, TOKENS)
    targets = TOKENS[:, 1:]
    dla = feature_logit_attribution(model, cache, sae, TOKENS, granularity=granularity)
    expected = logits.gather(-1, TOKENS[..., None])[..., 0]
    torch.testing.assert_close(dla.total(), expected, rtol=0, atol=1e-10)
    assert dla.labels[-1] == "b_U" and "sae_error" in dla.labels
    if point.endswith("resid_pre"):
        assert ("L1_attn" if granularity == "sublayer" else "L1H0") in dla.labels
    assert not any(label.startswith("L0") for label in dla.labels)
    diff = feature_logit_attribution(model, cache, sae, targets[:, :1], targets[:, 1:2])
    assert diff.metric == "logit difference"


def test_shipped_two_layer_model():
    model = HookedTransformer.from_pretrained("bytes-attn-only-2l").to(torch.float64)
    point = "blocks.1.hook_resid_pre"
    sae = random_sae(point, d_in=model.cfg.d_model, d_sae=64)
    tokens = model.to_tokens("def f(x): return x + x")
    logits, cache = spliced_run(model, sae, tokens)
    torch.testing.assert_close(logits, model(tokens), rtol=0, atol=1e-10)
    decomp = feature_decomposition(model, cache, sae, check=True)
    assert len(decomp) > 2
    dla = feature_logit_attribution(model, cache, sae, tokens)
    expected = logits.gather(-1, tokens[..., None])[..., 0]
    torch.testing.assert_close(dla.total(), expected, rtol=0, atol=1e-10)


def test_bad_input():
    model = tiny_model()
    sae = random_sae("blocks.1.hook_resid_pre")
    _, plain = model.run_with_cache(TOKENS)
    with pytest.raises(KeyError, match="record it with the SAE spliced"):
        feature_decomposition(model, plain, sae)
    mlp_sae = random_sae("blocks.0.mlp.hook_post", d_in=32)
    _, cache = spliced_run(model, mlp_sae, TOKENS)
    with pytest.raises(ValueError, match="not a resid_pre, resid_mid or resid_post"):
        feature_decomposition(model, cache, mlp_sae)


def test_check_catches_a_wrong_decomposition():
    model, sae = tiny_model(), random_sae("blocks.1.hook_resid_pre")
    _, cache = spliced_run(model, sae, TOKENS)
    other = random_sae("blocks.1.hook_resid_pre")
    with torch.no_grad():
        other.W_dec.mul_(2)  # not the SAE that ran
    with pytest.raises(DecompositionError, match="does not add up"):
        feature_decomposition(model, cache, other, check=True)
