"""Patching SAE features: exact patches against the stream they should give, and the
first-order estimate against a hand-written gradient; both comparable by compare_patching."""

import torch

from analysis.patching import compare_patching
from analysis.patching.feature_patching import feature_activation_patch, feature_attribution_patch
from hookedattn.sae import SAEConfig, SparseAutoencoder
from hookedattn.testing import tiny_model

POINT = "blocks.1.hook_resid_pre"
CLEAN = torch.randint(0, 20, (3, 8), generator=torch.Generator().manual_seed(0))
CORRUPTED = torch.randint(0, 20, (3, 8), generator=torch.Generator().manual_seed(1))


def setup():
    model = tiny_model(n_ctx=8, d_vocab=20, act_fn="gelu", d_mlp=32)
    sae = SparseAutoencoder(SAEConfig(16, 24, POINT, dtype="float64", seed=2))
    with torch.no_grad():
        sae.b_enc.add_(0.2)
        # A decoder bias away from zero, so that a reconstruction which forgets it differs.
        sae.b_dec.copy_(0.3 * torch.randn(16, generator=torch.Generator().manual_seed(3)))
    return model, sae


def metric(logits):
    return logits[:, -1, 3] - logits[:, -1, 5]


def spliced_point(model, sae, tokens):
    names = [POINT, f"{POINT}.sae.hook_acts", f"{POINT}.sae.hook_error"]
    with model.saes([sae]):
        return model.run_with_cache(tokens, names_filter=names)[1]


def test_activation_patch_moves_the_stream_by_the_features_write():
    model, sae = setup()
    result = feature_activation_patch(model, sae, CLEAN, CORRUPTED, metric, features=[0, 5])
    clean, corrupted = spliced_point(model, sae, CLEAN), spliced_point(model, sae, CORRUPTED)
    for row, f in enumerate([0, 5]):
        delta = (
            clean[f"{POINT}.sae.hook_acts"][..., f] - corrupted[f"{POINT}.sae.hook_acts"][..., f]
        )
        resid = corrupted[POINT] + delta[..., None] * sae.W_dec[f].detach()
        with torch.no_grad():
            expected = metric(model(resid, start_at_layer=1))
        torch.testing.assert_close(result.per_prompt[row], expected, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(result.clean, metric(model(CLEAN)).detach())
    assert result.labels == (("F0", "F5"),)


def test_attribution_patch_is_gradient_times_difference():
    model, sae = setup()
    result = feature_attribution_patch(model, sae, CLEAN, CORRUPTED, metric)
    clean, corrupted = spliced_point(model, sae, CLEAN), spliced_point(model, sae, CORRUPTED)
    acts = corrupted[f"{POINT}.sae.hook_acts"].clone().requires_grad_(True)
    recons = acts @ sae.W_dec.detach() + sae.b_dec.detach()
    metric(model(recons + corrupted[f"{POINT}.sae.hook_error"], start_at_layer=1)).sum().backward()
    delta = clean[f"{POINT}.sae.hook_acts"] - corrupted[f"{POINT}.sae.hook_acts"]
    features = [int(label[1:]) for label in result.labels[0]]
    expected = (acts.grad * delta)[..., features].sum(1).T + result.corrupted
    torch.testing.assert_close(result.per_prompt, expected, rtol=1e-9, atol=1e-9)


def test_compare_patching_of_features():
    model, sae = setup()
    approx = feature_attribution_patch(model, sae, CLEAN, CORRUPTED, metric)
    exact = feature_activation_patch(model, sae, CLEAN, CORRUPTED, metric)
    comparison = compare_patching(approx, exact)
    assert comparison.labels == exact.labels and len(exact.labels[0]) > 0
    assert comparison.error.shape == (len(exact.labels[0]),)
    assert comparison.correlation > 0.5
