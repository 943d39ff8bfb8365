"""Training SAEs from an activation store, and evaluating them spliced into the model."""

import copy

import pytest
import torch

from hookedattn import HookedTransformer
from hookedattn.sae import SAEConfig, SparseAutoencoder, TrainingStep, evaluate_sae, train_sae
from hookedattn.sae.training import _fold
from hookedattn.store import ActivationStore, collect_activations

POINT = "blocks.1.hook_resid_pre"


@pytest.fixture(scope="module")
def model():
    return HookedTransformer.from_pretrained("bytes-attn-only-2l")


@pytest.fixture(scope="module")
def store(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("acts")
    collect_activations(model, None, names=[POINT], out=out, context=64, n_tokens=4096,
                        batch_size=16, progress=False)  # fmt: skip
    return ActivationStore(out, model=model)


def train(store, **kw):
    args = dict(d_sae=128, steps=30, batch_size=256, progress=False, l1=1.0)
    return train_sae(store, POINT, **{**args, **kw})


def test_deterministic_per_seed(store):
    a, b, c = train(store), train(store), train(store, seed=1)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.W_enc, c.W_enc)


def test_training_improves_reconstruction_and_logs(store):
    log: list[TrainingStep] = []
    sae = train(store, steps=60, log=log, log_every=20)
    assert [r.step for r in log] == [0, 20, 40, 59] and log[-1].tokens == 60 * 256
    assert log[-1].fve > log[0].fve and log[-1].fve > 0.5
    assert sae.cfg.hook_name == POINT
    torch.testing.assert_close(sae.W_dec.norm(dim=-1), torch.ones(128))


def test_topk_training_keeps_k_features(store):
    sae = train(store, l1=None, k=8)
    x = store.rows(POINT, slice(0, 100)).float()
    assert ((sae.encode(x) > 0).sum(-1) <= 8).all()


def test_folding_the_normalisation_gives_the_same_reconstruction():
    sae = SparseAutoencoder(SAEConfig(8, 20, seed=3))
    with torch.no_grad():
        sae.b_enc.normal_(generator=torch.Generator().manual_seed(0))
        sae.b_dec.normal_(generator=torch.Generator().manual_seed(1))
    x = torch.randn(50, 8)
    mean, scale = torch.randn(8), 3.7
    expected = sae((x - mean) / scale) * scale + mean
    _fold(sae, mean, scale)
    torch.testing.assert_close(sae(x), expected, rtol=1e-5, atol=1e-5)


def test_bad_training_input(store, model, tmp_path):
    with pytest.raises(ValueError, match="one of l1 .* k .* or l0"):
        train(store, k=4)
    with pytest.raises(ValueError, match="fewer than one batch"):
        train(store, batch_size=10**6)
    # A model with a NaN embedding row (a store refuses to collect through an edit hook).
    poisoned = copy.deepcopy(model)
    with torch.no_grad():
        poisoned.embed.W_E[ord(" ")] = float("nan")
    collect_activations(poisoned, None, names=[POINT], out=tmp_path / "nan", context=64,
                        n_tokens=1024, batch_size=16, progress=False)  # fmt: skip
    with pytest.raises(ValueError, match="holds NaN or infinite values"):
        train(ActivationStore(tmp_path / "nan"), batch_size=128)


def exact_sae(d: int) -> SparseAutoencoder:
    """relu(x) - relu(-x) = x: a two-sided dictionary that reconstructs exactly."""
    sae = SparseAutoencoder(SAEConfig(d, 2 * d, POINT, pre_bias="none"))
    eye = torch.eye(d)
    with torch.no_grad():
        sae.W_enc.copy_(torch.cat([eye, -eye], 1))
        sae.W_dec.copy_(torch.cat([eye, -eye], 0))
    return sae


def test_evaluation_of_an_exact_sae(model):
    tokens = model.to_tokens(["def f(x):\n    return x", "import os\nimport sys"])
    result = evaluate_sae(model, exact_sae(model.cfg.d_model), tokens)
    assert result.fve == pytest.approx(1.0, abs=1e-5)
    assert result.loss_spliced == pytest.approx(result.loss_clean, abs=1e-5)
    assert result.ce_recovered_vs_zero == pytest.approx(1.0, abs=1e-4)
    assert result.l0 == pytest.approx(model.cfg.d_model, abs=1)
    assert "CE loss recovered vs mean-ablation" in str(result)


def test_evaluation_ablations_match_hand_computed_losses(model, store):
    tokens = model.to_tokens(["def f(x):\n    return x", "import os\nimport sys"])
    sae = train(store)
    result = evaluate_sae(model, sae, tokens)
    with torch.no_grad():
        x = model.run_with_cache(tokens, names_filter=POINT)[1][POINT]
        mean = x.flatten(0, 1).mean(0).expand_as(x)
        losses = [
            float(model(resid, start_at_layer=1, tokens=tokens, return_type="loss"))
            for resid in (torch.zeros_like(x), mean, sae(x))
        ]
    measured = [result.loss_zero_ablated, result.loss_mean_ablated, result.loss_spliced]
    assert measured == pytest.approx(losses, rel=1e-5)
    assert result.loss_clean < min(losses)
    assert 0 < result.dead + result.dense <= 2 * result.d_sae


def test_checkpoints_load_and_the_last_is_the_result(store, tmp_path):
    sae = train(store, checkpoint_every=15, checkpoint_dir=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-000015", "step-000030"]
    last = SparseAutoencoder.load(tmp_path / "step-000030")
    assert all(torch.equal(p, q) for p, q in zip(last.parameters(), sae.parameters(), strict=True))
    first = SparseAutoencoder.load(tmp_path / "step-000015")
    assert not torch.equal(first.W_enc, sae.W_enc)
    with pytest.raises(ValueError, match="both checkpoint_every and checkpoint_dir"):
        train(store, checkpoint_every=5)
