"""Feature decompositions at a spliced SAE: exact sums to the stream and to the logits."""

from functools import partial

import pytest
import torch

from analysis import decompose_resid, direct_logit_attribution
from analysis._resid_stack import DecompositionError
from analysis.features import feature_decomposition, feature_logit_attribution
from hookedattn import HookedTransformer
from hookedattn.sae import SAEConfig, SparseAutoencoder, load_pretrained_sae
from hookedattn.testing import tiny_model

make_model = partial(tiny_model, n_ctx=8, d_vocab=20, act_fn="gelu", d_mlp=32)


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
    model, sae = make_model(), random_sae(point)
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
    model, sae = make_model(), random_sae("blocks.1.hook_resid_pre")
    with torch.no_grad():
        sae.b_enc[:20] = -1e3  # these never fire
    _, cache = spliced_run(model, sae, TOKENS)
    labels = feature_decomposition(model, cache, sae).labels
    assert not {f"F{f}" for f in range(20)} & set(labels) and "F30" in labels


@pytest.mark.parametrize("granularity", ["sublayer", "head"])
@pytest.mark.parametrize("point", ["blocks.1.hook_resid_pre", "blocks.1.hook_resid_post"])
def test_feature_logit_attribution_sums_to_the_logits(point, granularity):
    model, sae = make_model(), random_sae(point)
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


SHIPPED_MODEL, SHIPPED_POINT = "bytes-attn-only-2l", "blocks.1.hook_resid_pre"
# SAEs at the shipped model's SHIPPED_POINT: one drawn at random and the one shipped, each
# with a text to run and a number of components its decomposition has more than.
SAES_OF_THE_SHIPPED_MODEL = {
    "random": (
        lambda d_model: random_sae(SHIPPED_POINT, d_in=d_model, d_sae=64),
        "def f(x): return x + x",
        2,
    ),
    "shipped": (
        lambda d_model: load_pretrained_sae(SHIPPED_MODEL, SHIPPED_POINT).to(torch.float64),
        "for i in range(10):\n    for i in range(10):\n",
        16,
    ),
}


@pytest.mark.parametrize("which", SAES_OF_THE_SHIPPED_MODEL)
def test_feature_identities_on_the_shipped_two_layer_model(which):
    make_sae, text, fewest_components = SAES_OF_THE_SHIPPED_MODEL[which]
    model = HookedTransformer.from_pretrained(SHIPPED_MODEL).to(torch.float64)
    sae = make_sae(model.cfg.d_model)
    tokens = model.to_tokens(text)
    logits, cache = spliced_run(model, sae, tokens)
    torch.testing.assert_close(logits, model(tokens), rtol=0, atol=1e-10)
    decomp = feature_decomposition(model, cache, sae, check=True)
    assert len(decomp) > fewest_components
    dla = feature_logit_attribution(model, cache, sae, tokens)
    expected = logits.gather(-1, tokens[..., None])[..., 0]
    torch.testing.assert_close(dla.total(), expected, rtol=0, atol=1e-10)


def test_bad_input():
    model = make_model()
    sae = random_sae("blocks.1.hook_resid_pre")
    _, plain = model.run_with_cache(TOKENS)
    with pytest.raises(KeyError, match="record it with the SAE spliced"):
        feature_decomposition(model, plain, sae)
    mlp_sae = random_sae("blocks.0.mlp.hook_post", d_in=32)
    _, cache = spliced_run(model, mlp_sae, TOKENS)
    with pytest.raises(ValueError, match="not a resid_pre, resid_mid or resid_post"):
        feature_decomposition(model, cache, mlp_sae)


def test_check_catches_a_wrong_decomposition():
    model, sae = make_model(), random_sae("blocks.1.hook_resid_pre")
    _, cache = spliced_run(model, sae, TOKENS)
    other = random_sae("blocks.1.hook_resid_pre")
    with torch.no_grad():
        other.W_dec.mul_(2)  # not the SAE that ran
    with pytest.raises(DecompositionError, match="does not add up"):
        feature_decomposition(model, cache, other, check=True)


# ------------------------------------------- the "features" granularity of decompose_resid
POINTS = [
    (0, "resid_pre"), (0, "resid_mid"), (0, "resid_post"),
    (1, "resid_pre"), (1, "resid_mid"), (1, "resid_post"),
]  # fmt: skip


@pytest.mark.parametrize("sae_at", [0, 2, 4])
@pytest.mark.parametrize("use_error_term", [True, False])
def test_features_granularity_sums_to_every_later_stream(sae_at, use_error_term):
    model = make_model()
    point = f"blocks.{POINTS[sae_at][0]}.hook_{POINTS[sae_at][1]}"
    sae = random_sae(point)
    _, cache = spliced_run(model, sae, TOKENS, use_error_term)
    at_sae = decompose_resid(model, cache, *POINTS[sae_at], "sublayer").labels
    for layer, site in POINTS[sae_at:]:
        decomp = decompose_resid(model, cache, layer, site, "features", sae=sae, check=True)
        target = cache[f"blocks.{layer}.hook_{site}"]
        torch.testing.assert_close(decomp.sum(), target, rtol=0, atol=1e-10)
        later = decompose_resid(model, cache, layer, site, "sublayer").labels[len(at_sae) :]
        n_features = len(decomp) - 2 - len(later)
        assert decomp.labels[n_features:] == ("sae_b_dec", "sae_error", *later)
        assert all(label.startswith("F") for label in decomp.labels[:n_features])
        assert (decomp.site, decomp.layer) == (site, layer)
    at_point = decompose_resid(model, cache, *POINTS[sae_at], "features", sae=sae)
    expected = feature_decomposition(model, cache, sae)
    assert at_point.labels == expected.labels
    torch.testing.assert_close(at_point.components, expected.components, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_direct_logit_attribution_of_the_features_granularity(dtype):
    model, sae = make_model(dtype=dtype), random_sae("blocks.1.hook_resid_pre")
    sae = sae.to(dtype)
    logits, cache = spliced_run(model, sae, TOKENS)
    decomp = decompose_resid(model, cache, None, granularity="features", sae=sae, check=True)
    dla = direct_logit_attribution(model, cache, decomp, TOKENS)
    expected = logits.gather(-1, TOKENS[..., None])[..., 0]
    tol = {"rtol": 0, "atol": 1e-10} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(dla.total(), expected, **tol)
    assert dla.labels[-3:] == ("L1_mlp", "ln_final_bias", "b_U")
    by_features = feature_logit_attribution(model, cache, sae, TOKENS)
    assert by_features.labels == dla.labels
    torch.testing.assert_close(by_features.contributions, dla.contributions, **tol)


def test_features_granularity_on_the_shipped_model():
    model = HookedTransformer.from_pretrained("bytes-attn-only-2l").to(torch.float64)
    sae = random_sae("blocks.1.hook_resid_pre", d_in=model.cfg.d_model, d_sae=64)
    tokens = model.to_tokens("def f(x): return x + x")
    logits, cache = spliced_run(model, sae, tokens)
    decomp = decompose_resid(model, cache, None, granularity="features", sae=sae, check=True)
    assert decomp.labels[-3:] == ("sae_b_dec", "sae_error", "L1_attn")
    dla = direct_logit_attribution(model, cache, decomp, tokens)
    expected = logits.gather(-1, tokens[..., None])[..., 0]
    torch.testing.assert_close(dla.total(), expected, rtol=0, atol=1e-10)


def test_features_granularity_on_a_parallel_block():
    model = make_model(parallel_attn_mlp=True)
    sae = random_sae("blocks.0.hook_resid_post")
    _, cache = spliced_run(model, sae, TOKENS, use_error_term=False)
    decomp = decompose_resid(model, cache, None, granularity="features", sae=sae, check=True)
    assert decomp.labels[-4:] == ("sae_b_dec", "sae_error", "L1_attn", "L1_mlp")
    torch.testing.assert_close(decomp.sum(), cache["blocks.1.hook_resid_post"], rtol=0, atol=1e-10)


def test_features_granularity_bad_input():
    model, sae = make_model(), random_sae("blocks.1.hook_resid_mid")
    _, cache = spliced_run(model, sae, TOKENS)
    with pytest.raises(ValueError, match="granularity='features' needs the SAE"):
        decompose_resid(model, cache, None, granularity="features")
    with pytest.raises(ValueError, match="sae is for granularity='features', not 'head'"):
        decompose_resid(model, cache, None, granularity="head", sae=sae)
    with pytest.raises(
        ValueError, match="reads blocks.1.hook_resid_mid, after blocks.1.hook_resid_pre"
    ):
        decompose_resid(model, cache, 1, "resid_pre", "features", sae=sae)
