"""Training transcoders from an activation store's MLP input/output pairs."""

import pytest
import torch

from hookedattn import HookedTransformer
from hookedattn.sae import (
    CrossLayerTranscoder,
    CrossLayerTranscoderConfig,
    TrainingStep,
    Transcoder,
    TranscoderConfig,
    TranscoderSet,
    feature_examples,
    train_cross_layer_transcoder,
    train_transcoder,
)
from hookedattn.sae._transcoder_resampling import resample_dead
from hookedattn.sae.transcoder_training import _fold, _Normalisation
from hookedattn.store import ActivationStore, collect_activations

NAMES = [f"blocks.{i}.{h}" for i in range(2) for h in ("ln2.hook_out", "hook_mlp_out")]


@pytest.fixture(scope="module")
def model():
    return HookedTransformer.from_pretrained("bytes-gelu-2l")


@pytest.fixture(scope="module")
def store(model, tmp_path_factory):
    out = tmp_path_factory.mktemp("acts")
    collect_activations(model, None, names=NAMES, out=out, context=64, n_tokens=4096,
                        batch_size=16, shard_contexts=16, progress=False)  # fmt: skip
    return ActivationStore(out, model=model)


def train(store, layer=1, **kw):
    args = dict(d_sae=64, steps=30, batch_size=256, progress=False, k=8)
    return train_transcoder(store, layer, **{**args, **kw})


def test_batches_of_two_names_under_one_seed_are_pairs_of_rows(store):
    # What training relies on to pair each MLP input with its output.
    x_all, y_all = store.rows(NAMES[0], slice(None)), store.rows(NAMES[1], slice(None))
    direction = torch.randn(x_all.shape[1], dtype=torch.float64)
    keys, order = (x_all.double() @ direction).sort()  # a row's key finds it among all rows
    streams = [store.batches(n, 512, shuffle=True, seed=3, drop_last=True) for n in NAMES[:2]]
    for x, y in zip(*streams, strict=True):
        rows = order[torch.searchsorted(keys, x.double() @ direction).clamp(max=len(keys) - 1)]
        assert torch.equal(x_all[rows], x)  # every row found
        assert torch.equal(y_all[rows], y)  # and its output drawn beside it


def test_training_is_deterministic_per_seed(store):
    a, b, c = train(store), train(store), train(store, seed=1)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not torch.equal(a.W_enc, c.W_enc)


def test_training_learns_the_mlp_and_logs(store):
    log: list[TrainingStep] = []
    tc = train(store, steps=80, log=log, log_every=20, skip=True, lr=4e-3)
    assert [r.step for r in log] == [0, 20, 40, 60, 79] and log[-1].tokens == 80 * 256
    assert log[-1].fve > log[0].fve and log[-1].fve > 0.5
    assert (tc.cfg.hook_name, tc.cfg.hook_name_out) == tuple(NAMES[2:])
    x, y = store.rows(NAMES[2], slice(0, 2000)), store.rows(NAMES[3], slice(0, 2000))
    with torch.no_grad():
        fve = 1 - (tc(x) - y).pow(2).sum() / (y - y.mean(0)).pow(2).sum()
    assert float(fve) > 0.5  # in the model's units: the normalisation is folded in


@pytest.mark.parametrize("penalty", [dict(k=None, l1=1.0), dict(k=None, l0=0.05)])
def test_every_variant_trains(store, penalty):
    log: list[TrainingStep] = []
    tc = train(store, log=log, log_every=29, **penalty)
    assert tc.cfg.activation == ("relu" if "l1" in penalty else "jumprelu")
    assert log[-1].fve > log[0].fve


def test_a_cross_layer_transcoder_trains_on_every_layer(store):
    log: list[TrainingStep] = []
    clt = train_cross_layer_transcoder(store, 2, d_sae=64, k=8, steps=40, batch_size=256,
                                       progress=False, log=log, log_every=39)  # fmt: skip
    assert log[-1].fve > log[0].fve and log[-1].l0 == 16.0  # 8 per layer
    norms = torch.cat([clt.W_dec[0].flatten(1), clt.W_dec[1].flatten(1)], -1)
    assert norms.shape == (64, 3 * 64)  # layer 0 writes twice, layer 1 once


@pytest.mark.parametrize("kind", ["per_layer", "cross_layer"])
def test_resampling_points_dead_features_at_badly_predicted_rows(kind):
    g = torch.Generator().manual_seed(0)
    if kind == "per_layer":
        hooks = "blocks.0.ln2.hook_out", "blocks.0.hook_mlp_out"
        tset = TranscoderSet([Transcoder(TranscoderConfig(8, 20, 6, *hooks))])
    else:
        tset = TranscoderSet(CrossLayerTranscoder(CrossLayerTranscoderConfig(2, 8, 20, 6)))
    W_enc, b_enc = tset.encoder(0)
    dead = torch.zeros(20, dtype=torch.bool)
    dead[[2, 5, 11]] = True
    x = torch.randn(16, 8, generator=g)
    residuals = {layer: torch.zeros(16, 6) for layer in tset.layers}
    bad = [3, 7, 12]  # the rows predicted badly; every other row is predicted exactly
    for layer in tset.outputs(0):
        residuals[layer][bad] = torch.randn(3, 6, generator=g)
    optimizer = torch.optim.Adam([p for m in tset.modules for p in m.parameters()])
    revived = resample_dead(tset, 0, optimizer, x, residuals, dead, seed=0, activation="relu")
    assert torch.equal(revived, dead)
    decoders = tset.feature_decoders(0).detach()
    drawn = set()
    for feature in (2, 5, 11):  # each pointed at one of the bad rows, a different one
        direction = W_enc[:, feature].detach() / W_enc[:, feature].detach().norm()
        (row,) = [i for i in bad if torch.allclose(direction, x[i] / x[i].norm(), atol=1e-6)]
        drawn.add(row)
        r = torch.stack([residuals[o][row] for o in tset.outputs(0)])
        torch.testing.assert_close(decoders[feature].reshape(r.shape), r / r.norm())
        assert b_enc[feature] == 0 and tset.pre_activations(0, x[row])[feature] > 0
    assert drawn == set(bad)


@pytest.mark.parametrize("kind", ["skip", "cross_layer"])
def test_folding_the_normalisation_keeps_the_prediction(kind):
    g = torch.Generator().manual_seed(0)
    if kind == "skip":
        hooks = "blocks.0.ln2.hook_out", "blocks.0.hook_mlp_out"
        tset = TranscoderSet([Transcoder(TranscoderConfig(8, 20, 6, *hooks, skip=True))])
    else:
        tset = TranscoderSet(CrossLayerTranscoder(CrossLayerTranscoderConfig(2, 8, 20, 6)))
    with torch.no_grad():
        for module in tset.modules:
            for p in module.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    xs = {i: torch.randn(30, 8, generator=g) for i in tset.layers}
    n_in = _Normalisation({i: torch.randn(8, generator=g) for i in tset.layers},
                          {i: 2.0 + i for i in tset.layers})  # fmt: skip
    n_out = _Normalisation({i: torch.randn(6, generator=g) for i in tset.layers},
                           {i: 0.5 + i for i in tset.layers})  # fmt: skip
    normed = n_in.apply(xs)
    acts = {i: tset.encode(i, normed[i]) for i in tset.layers}
    expected = {
        i: tset.decode(i, acts, normed[i]) * n_out.scale[i] + n_out.mean[i] for i in tset.layers
    }
    _fold(tset, n_in, n_out)
    folded = {i: tset.encode(i, xs[i]) for i in tset.layers}
    for i in tset.layers:
        torch.testing.assert_close(folded[i], acts[i], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(tset.decode(i, folded, xs[i]), expected[i], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "kw, message",
    [
        (dict(k=8, l1=1.0), "give one of l1"),
        (dict(k=None), "give one of l1"),
        (dict(steps=0), "steps must be a positive int"),
        (dict(l1=-1.0, k=None), "l1 must be a non-negative number"),
        (dict(resample_every=0), "resample_every must be a positive int or None"),
        (dict(batch_size=10**6), "fewer than one batch of 1000000"),
    ],
)
def test_bad_arguments_are_refused(store, kw, message):
    with pytest.raises(ValueError, match=message):
        train(store, **kw)


def test_feature_examples_are_the_top_activations_over_the_store(store, model):
    tcs = [Transcoder(TranscoderConfig(64, 32, 64, f"blocks.{i}.ln2.hook_out",
                                       f"blocks.{i}.hook_mlp_out", "topk", k=4, seed=i))
           for i in range(2)]  # fmt: skip
    examples = feature_examples(store, tcs, [(1, 3), (0, 5), (1, 9)], n=3, context=6,
                                model=model, batch_size=1000)  # fmt: skip
    assert set(examples) == {"1_3", "0_5", "1_9"}
    acts = tcs[1].encode(store.rows("blocks.1.ln2.hook_out", slice(None)))[:, 3]
    top = acts.topk(3)
    assert [e["activation"] for e in examples["1_3"]] == pytest.approx(top.values.tolist())
    origin = store.origin(top.indices)
    for example, pos, token in zip(examples["1_3"], origin.position, origin.token, strict=True):
        assert len(example["tokens"]) == min(int(pos) + 1, 6)
        assert example["position"] == len(example["tokens"]) - 1
        assert example["tokens"][-1] == model.to_str_tokens(token[None])[0]
    with pytest.raises(ValueError, match="no feature 99 at layer 1"):
        feature_examples(store, tcs, [(1, 99)])
