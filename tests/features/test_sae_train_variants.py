"""Dead-feature resampling and JumpReLU training (straight-through thresholds, L0 penalty)."""

import pytest
import torch

from hookedattn import HookedTransformer
from hookedattn.sae import SAEConfig, SparseAutoencoder, TrainingStep, train_sae
from hookedattn.sae._objectives import L0Penalty, jumprelu_ste
from hookedattn.sae._resampling import resample_dead
from hookedattn.sae.training import _fold
from hookedattn.store import ActivationStore, collect_activations

POINT = "blocks.1.hook_resid_pre"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    model = HookedTransformer.from_pretrained("bytes-attn-only-2l")
    out = tmp_path_factory.mktemp("acts")
    collect_activations(model, None, names=[POINT], out=out, context=64, n_tokens=4096,
                        batch_size=16, progress=False)  # fmt: skip
    return ActivationStore(out, model=model)


def never_fired(sae: SparseAutoencoder, store: ActivationStore) -> int:
    """Features that fire on no row of the store."""
    with torch.no_grad():
        acts = sae.encode(store.rows(POINT, slice(0, len(store))).float())
    return int((acts.amax(0) <= 0).sum())


# ---------------------------------------------------------------------- resampling
def topk_run(store, **kw) -> SparseAutoencoder:
    # Many features for few tokens and a small k: without help a good share never fires.
    args = dict(d_sae=512, k=4, steps=200, dead_window=20, batch_size=256, seed=1)
    return train_sae(store, POINT, progress=False, **{**args, **kw})


def test_resampling_revives_dead_features(store):
    without = never_fired(topk_run(store), store)
    resampled = never_fired(topk_run(store, resample_every=25), store)
    assert without > 40  # the setup does kill features (73 of 512 when measured)
    assert resampled < 0.25 * without  # 6 when measured


def test_resampling_is_deterministic_per_seed(store):
    a, b = (topk_run(store, steps=80, resample_every=40) for _ in range(2))
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    c = topk_run(store, steps=80, resample_every=40, seed=2)
    assert not torch.equal(a.W_dec, c.W_dec)


def test_a_resampled_feature_points_at_its_row_and_fires_on_it():
    sae = SparseAutoencoder(SAEConfig(8, 16, POINT, seed=0))
    optimizer = torch.optim.Adam(sae.parameters(), lr=1e-3)
    x = torch.randn(32, 8, generator=torch.Generator().manual_seed(0))
    (sae(x) - x).pow(2).sum().backward()
    optimizer.step()
    dead = torch.zeros(16, dtype=torch.bool)
    dead[[3, 7]] = True
    before = sae.W_dec.detach().clone()
    resampled = resample_dead(sae, optimizer, x, dead, seed=0)
    assert torch.equal(resampled, dead)
    torch.testing.assert_close(sae.W_dec[~dead], before[~dead], rtol=0, atol=0)
    torch.testing.assert_close(sae.W_dec[dead].norm(dim=-1), torch.ones(2))
    with torch.no_grad():
        centred = x - sae.b_dec
        cosine = sae.W_dec[dead] @ (centred / centred.norm(dim=-1, keepdim=True)).T
        assert torch.allclose(cosine.amax(-1), torch.ones(2))
        rows = cosine.argmax(-1)  # the row each now points at
        assert (sae.encode(x[rows])[[0, 1], [3, 7]] > 0).all()
    for key in ("exp_avg", "exp_avg_sq"):
        assert not optimizer.state[sae.W_dec][key][dead].any()
        assert not optimizer.state[sae.W_enc][key][:, dead].any()
        assert optimizer.state[sae.W_dec][key][~dead].any()


# ---------------------------------------------------------------------- JumpReLU
def test_threshold_gradients_are_the_straight_through_estimates():
    """Rajamanoharan et al. eq. 11-12: d/dθ of pre·H(pre-θ) is -(θ/ε)K((pre-θ)/ε), of
    H(pre-θ) it is -(1/ε)K, with K the unit rectangle; checked against those formulas."""
    generator = torch.Generator().manual_seed(0)
    pre = torch.randn(200, 6, generator=generator, dtype=torch.float64)
    threshold = torch.full((6,), 0.3, dtype=torch.float64, requires_grad=True)
    eps = 0.2
    acts = jumprelu_ste(pre, threshold, eps)
    torch.testing.assert_close(acts, torch.relu(pre) * (pre > 0.3))
    upstream = torch.randn(200, 6, generator=generator, dtype=torch.float64)
    (acts * upstream).sum().backward()
    kernel = ((pre - 0.3).abs() < eps / 2).double() / eps
    torch.testing.assert_close(threshold.grad, -(0.3 * kernel * upstream).sum(0))
    assert threshold.grad.abs().sum() > 0
    sae = SparseAutoencoder(SAEConfig(4, 6, activation="jumprelu", dtype="float64"))
    with torch.no_grad():
        sae.activation.threshold.fill_(0.3)
    L0Penalty(2.0, eps)(sae, pre, acts.detach()).backward()
    torch.testing.assert_close(sae.activation.threshold.grad, -2.0 * kernel.sum(0) / 200)


def jumprelu_run(store, l0, log=None) -> SparseAutoencoder:
    return train_sae(store, POINT, d_sae=128, l0=l0, steps=150, batch_size=256, lr=1e-2,
                     progress=False, log=log, log_every=50)  # fmt: skip


def test_jumprelu_training_lowers_the_loss_and_l0_follows_the_penalty(store):
    logs: dict[float, list[TrainingStep]] = {0.01: [], 1.0: []}
    saes = {l0: jumprelu_run(store, l0, log) for l0, log in logs.items()}
    for log in logs.values():
        assert log[-1].loss < 0.5 * log[0].loss
    rows = store.rows(POINT, slice(0, len(store))).float()
    with torch.no_grad():
        l0s = {c: float((s.encode(rows) > 0).sum(-1).float().mean()) for c, s in saes.items()}
    assert l0s[1.0] < l0s[0.01] / 3  # 10.5 against 77.6 when measured
    sae = saes[1.0]
    assert sae.cfg.activation == "jumprelu" and (sae.activation.threshold > 0).all()
    # In the model's units (thresholds folded with the rest) it still reconstructs.
    with torch.no_grad():
        residual = (sae(rows) - rows).pow(2).sum()
    assert 1 - residual / (rows - rows.mean(0)).pow(2).sum() > 0.8


def test_folding_scales_the_thresholds():
    sae = SparseAutoencoder(SAEConfig(8, 20, activation="jumprelu", seed=3))
    with torch.no_grad():
        sae.activation.threshold.uniform_(0, 0.5, generator=torch.Generator().manual_seed(0))
        sae.b_enc.normal_(generator=torch.Generator().manual_seed(1))
    x = torch.randn(50, 8, generator=torch.Generator().manual_seed(2))
    mean, scale = torch.randn(8, generator=torch.Generator().manual_seed(3)), 3.7
    expected = sae((x - mean) / scale) * scale + mean
    _fold(sae, mean, scale)
    torch.testing.assert_close(sae(x), expected, rtol=1e-5, atol=1e-5)


def test_bad_variant_arguments(store):
    def run(**kw):
        return train_sae(store, POINT, d_sae=16, steps=1, batch_size=64, progress=False, **kw)

    with pytest.raises(ValueError, match=r"one of l1 .* k .* or l0 .*, got \{'k': 4, 'l0': 1.0\}"):
        run(k=4, l0=1.0)
    with pytest.raises(ValueError, match="bandwidth must be a positive number, got 0"):
        run(l0=1.0, bandwidth=0.0)
    with pytest.raises(ValueError, match="resample_every must be a positive int or None, got 0"):
        run(k=4, resample_every=0)
