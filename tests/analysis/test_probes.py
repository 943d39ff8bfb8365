"""Linear probes: fits against independent solutions and optimality, the controls on data
whose answer is known (a property of the token, a property beyond it), and probes read
during generation against `run_with_cache` of the generated tokens."""

import pytest
import torch

from analysis import Probe, ProbeData, ProbeReadout, train_probe
from analysis.probes import _control_labels, _logistic_objective, _split
from hookedattn import ByteTokenizer
from hookedattn.store import ActivationStore, collect_activations
from hookedattn.testing import random_tiny_model

D = 24


def synthetic(rule: str, n_types=12, n_groups=40, per_group=10, seed=0) -> ProbeData:
    """Activations that hold the token (a fixed random vector per type) and, along one
    more direction, a hidden property: the label is a property of the token (`"token"`)
    or the hidden one (`"hidden"`), or a number along it (`"value"`). With few types a
    linear probe can memorise a label per type; with many more than `D` it cannot."""
    g = torch.Generator().manual_seed(seed)
    n = n_groups * per_group
    tokens = torch.randint(0, n_types, (n,), generator=g)
    types = torch.randn(n_types, D, generator=g, dtype=torch.float64)
    hidden = torch.randn(n, generator=g, dtype=torch.float64)
    direction = torch.randn(D, generator=g, dtype=torch.float64)
    noise = 0.1 * torch.randn(n, D, generator=g, dtype=torch.float64)
    acts = types[tokens] + hidden[:, None] * direction + noise
    labels = {
        "token": tokens % 3,
        "hidden": (hidden > 0).long(),
        "value": 2.0 * hidden + 0.5,
    }[rule]
    groups = torch.arange(n_groups).repeat_interleave(per_group)
    return ProbeData(acts, labels, tokens, groups, "blocks.0.hook_resid_post")


# ---------------------------------------------------------------- fits
def test_a_ridge_probe_is_the_least_squares_solution_of_the_augmented_system():
    data = synthetic("value")
    report = train_probe(data, "ridge", l2=0.5)
    train, _ = _split(data.groups, 0.25, torch.Generator().manual_seed(0))
    x, y = data.activations[train], data.labels[train][:, None]
    xc, yc = x - x.mean(0), y - y.mean(0)
    augmented = torch.cat([xc, 0.5**0.5 * torch.eye(D, dtype=torch.float64)])
    targets = torch.cat([yc, torch.zeros(D, 1, dtype=torch.float64)])
    W = torch.linalg.lstsq(augmented, targets).solution
    torch.testing.assert_close(report.probe.weight, W, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(report.probe.bias, y.mean(0) - x.mean(0) @ W, rtol=1e-10, atol=1e-10)


def test_a_logistic_probe_is_at_the_minimum_of_its_objective():
    data = synthetic("hidden")
    report = train_probe(data, "logistic", l2=0.01)
    train, _ = _split(data.groups, 0.25, torch.Generator().manual_seed(0))
    x, y = data.activations[train], data.labels[train]
    mean, std = x.mean(0), x.std(0)
    W = (report.probe.weight * std[:, None]).requires_grad_()  # back to standardised inputs
    b = (report.probe.bias + mean @ report.probe.weight).requires_grad_()
    loss, grad_W, grad_b = _logistic_objective((x - mean) / std, y, W, b, 0.01)
    loss.backward()  # autograd, against the gradient written out
    torch.testing.assert_close(grad_W, W.grad, rtol=1e-8, atol=1e-12)
    torch.testing.assert_close(grad_b, b.grad, rtol=1e-8, atol=1e-12)
    assert W.grad.abs().max() < 1e-6 and b.grad.abs().max() < 1e-6


def test_a_probe_predicts_its_classes_and_their_probabilities():
    data = synthetic("token")
    probe = train_probe(data, "logistic").probe
    assert probe.classes.tolist() == [0, 1, 2]
    probs = probe.probabilities(data.activations[:5])
    torch.testing.assert_close(probs.sum(-1), torch.ones(5, dtype=torch.float64))
    assert torch.equal(probe.predict(data.activations[:5]), probs.argmax(-1))


# ---------------------------------------------------------------- controls
def test_a_property_of_the_token_is_found_but_is_not_selective():
    report = train_probe(synthetic("token"), "logistic")
    assert report.score > 0.95
    assert report.control_score > 0.8  # the control task is memorised as easily
    assert report.selectivity < 0.2


def test_a_property_beyond_the_token_is_found_and_is_selective():
    report = train_probe(synthetic("hidden", n_types=300), "logistic")
    assert report.score > 0.9
    assert report.control_score < 0.75 and report.selectivity > 0.25
    assert abs(report.random_label_score - report.chance) < 0.15


def test_a_ridge_probe_reports_r2_with_its_controls():
    report = train_probe(synthetic("value", n_types=300), "ridge")
    assert report.score > 0.95 and report.chance == 0.0
    assert report.random_label_score < 0.1 and report.selectivity > 0.8


def test_the_control_task_gives_every_token_type_one_label_from_the_labels():
    tokens = torch.tensor([3, 1, 3, 2, 1, 3, 2])
    labels = torch.tensor([7, 8, 9, 7, 8, 9, 7])
    control = _control_labels(tokens, labels, torch.Generator().manual_seed(0))
    for t in tokens.unique():
        assert len(control[tokens == t].unique()) == 1
    assert set(control.tolist()) <= set(labels.tolist())


def test_the_split_keeps_each_group_on_one_side():
    groups = torch.arange(10).repeat_interleave(3)
    train, test = _split(groups, 0.3, torch.Generator().manual_seed(1))
    assert not set(groups[train].tolist()) & set(groups[test].tolist())
    assert len(groups[test].unique()) == 3 and len(train) + len(test) == 30


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [(dict(kind="svm"), "kind must be one of"), (dict(test_fraction=1.0), "test_fraction")],
)
def test_bad_probe_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        train_probe(synthetic("token"), **kwargs)


@pytest.mark.parametrize(("rule", "kind"), [("token", "logistic"), ("value", "ridge")])
@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_rows_that_are_not_finite_are_refused(rule, kind, value):
    data = synthetic(rule)
    data.activations[17, 3] = value  # one value among 4,800
    with pytest.raises(ValueError, match=r"1 of 400 rows hold values that are not finite"):
        train_probe(data, kind)


def test_ridge_targets_that_are_not_finite_are_refused():
    data = synthetic("value")
    data.labels[5] = float("nan")
    with pytest.raises(ValueError, match=r"first rows \[5\]"):
        train_probe(data, "ridge")


# ---------------------------------------------------------------- models and generation
@pytest.fixture(scope="module")
def model():
    return random_tiny_model(tokenizer=ByteTokenizer(), d_vocab=259, n_ctx=40, scale=0.3)


TEXTS = ["the cat sat on the mat", "a dog ran in the park", "an owl is up at night"]
NAME = "blocks.1.hook_resid_pre"


def is_vowel(tokens):
    return torch.isin(tokens, torch.tensor(list(b"aeiou"))).long()


def test_data_from_a_cache_keeps_the_real_positions(model):
    batch = model.tokenize(TEXTS)
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)
    data = ProbeData.from_cache(cache, NAME, is_vowel(batch.tokens), batch.tokens,
                                batch.attention_mask)  # fmt: skip
    keep = batch.attention_mask.bool()
    assert torch.equal(data.activations, cache[NAME][keep])
    assert torch.equal(data.groups, torch.arange(3)[:, None].expand(3, keep.shape[1])[keep])


def test_data_from_a_store_is_its_rows_with_their_tokens_and_contexts(model, tmp_path):
    collect_activations(model, TEXTS * 4, names=[NAME], out=tmp_path / "acts", context=8,
                        progress=False, dtype=torch.float64)  # fmt: skip
    store = ActivationStore(tmp_path / "acts")
    data = ProbeData.from_store(store, NAME, lambda origin: is_vowel(origin.token))
    assert torch.equal(data.activations, store.rows(NAME, slice(0, len(store))))
    assert torch.equal(data.labels, is_vowel(store.origin(slice(0, len(store))).token))
    assert torch.equal(data.groups, store.origin(slice(0, len(store))).context)
    report = train_probe(data, "logistic")
    assert 0 <= report.score <= 1 and report.n_train + report.n_test == len(store)


def test_a_probe_read_at_every_step_is_the_probe_on_the_generated_tokens(model):
    batch = model.tokenize(TEXTS)
    _, cache = model.run_with_cache(batch.tokens, attention_mask=batch.attention_mask)
    data = ProbeData.from_cache(cache, NAME, is_vowel(batch.tokens), batch.tokens,
                                batch.attention_mask)  # fmt: skip
    probe = train_probe(data, "logistic").probe
    readout = ProbeReadout(probe)
    prompt = model.to_tokens("the owl")
    with model.hooks(fwd_hooks=readout.hooks()):
        out = model.generate(prompt, 6, stop_at_eos=False)
    assert [v.shape[1] for v in readout.values] == [8, 1, 1, 1, 1, 1]
    _, full = model.run_with_cache(out[:, :-1], names_filter=NAME)
    assert torch.equal(readout.joined(), probe.read(full))
    steps = model.generate_steps(prompt, 6, stop_at_eos=False, names_filter=NAME)
    assert torch.equal(torch.cat([probe.read(s.cache) for s in steps], dim=1), probe.read(full))


def test_a_ridge_probe_has_no_probabilities():
    probe = Probe("ridge", torch.zeros(3, 1), torch.zeros(1), NAME)
    with pytest.raises(ValueError, match="probabilities are for logistic probes"):
        probe.probabilities(torch.zeros(2, 3))
