"""The findings of Elhage et al. 2021 and Olsson et al. 2022, checked on the shipped weights.

Every threshold is read against a baseline, and is the same as in the report of
`scripts/induction_circuit.py`:

- an induction head puts a majority (> 0.5) of its attention on its target, where uniform
  causal attention puts about 1/position; the induction heads are all layer-1 heads that do;
- a previous-token head, strictly, the same majority on the previous token; in its weak form,
  the head of its layer with the highest previous-token score, its attention peaking one back
  (the strict form does not hold on `attn-only-2l`: an expected failure, see the report);
- "well above" a random baseline: more than 3 of the baseline's standard deviations above
  its mean (`composition_scores`, `copying_scores` carry both);
- "far below" on a repeated sequence: under half the order-blind loss (each second-copy
  token predicted by its frequency in the first copy: the best use of the context without
  knowing the order); the one-layer model gets no lower than that order-blind loss;
- "most" in-context learning: more than half of the first-minus-second-copy loss difference;
- the 0-layer model gets >= 90% of the way from the unigram loss to the bigram loss;
- late context below early: negative by more than 3 standard errors;
- the same window: both scores rise the most between the same two consecutive checkpoints.
"""

import itertools

import pytest
import torch

from analysis import (
    composition_scores,
    copying_scores,
    detect_head,
    induction_scores,
    pattern_preserving_ablation,
    prev_token_scores,
)
from hookedattn import HookedTransformer, process_weights
from hookedattn.corpus import heldout_windows, load_stdlib_corpus, repeated_random_tokens
from hookedattn.loss import lm_cross_entropy_loss
from hookedattn.names import get_act_name
from hookedattn.pretrained import pretrained_info

MAJORITY, SIGMAS, FAR_BELOW, MOST, BIGRAM_SHARE = 0.5, 3.0, 0.5, 0.5, 0.9
PERIOD = 63


@pytest.fixture(scope="module")
def corpus():
    return load_stdlib_corpus()


@pytest.fixture(scope="module")
def windows(corpus):
    # 512 windows: with 64 the standard error of the late-minus-early difference (~0.12
    # nats) is as large as the difference itself.
    return heldout_windows(corpus.heldout, 512, 128)


@pytest.fixture(scope="module")
def tokens():
    return repeated_random_tokens(32, 2 * PERIOD + 1, PERIOD, torch.Generator().manual_seed(5))


@pytest.fixture(scope="module")
def two():
    return HookedTransformer.from_pretrained("attn-only-2l")


@pytest.fixture(scope="module")
def one():
    return HookedTransformer.from_pretrained("attn-only-1l")


def _copy_losses(model, tokens):
    with torch.no_grad():
        loss = lm_cross_entropy_loss(model(tokens), tokens, per_token=True).mean(0)
    return float(loss[1:PERIOD].mean()), float(loss[PERIOD:].mean())


def _order_blind(tokens):
    losses = []
    for row in tokens[:, 1 : PERIOD + 1]:
        counts = torch.bincount(row, minlength=256).double()
        losses.append(-(counts[row] / PERIOD).log().mean())
    return float(torch.stack(losses).mean())


@pytest.fixture(scope="module")
def circuit(two, tokens):
    with torch.no_grad():
        _, cache = two.run_with_cache(tokens)
    induction = induction_scores(two, cache=cache, tokens=tokens)
    head = int(induction.scores[1].argmax())
    processed = process_weights(two)
    composition = {kind: composition_scores(processed, kind) for kind in "QKV"}
    prev = int(composition["K"].scores[0, :, 1, head].argmax())
    return {
        "head": head,
        "prev": prev,
        "induction": induction,
        "prev_scores": prev_token_scores(two, cache),
        "composition": composition,
    }


def test_the_zero_layer_model_approximates_the_bigram_statistics(corpus, windows):
    model = HookedTransformer.from_pretrained("attn-only-0l")
    train = corpus.train
    counts = torch.zeros(256, 256, dtype=torch.float64)
    counts.index_put_((train[:-1], train[1:]), torch.ones(len(train) - 1).double(), True)
    previous, following = windows[:, 1:-1].flatten(), windows[:, 2:].flatten()
    bigram = -((counts + 0.1) / (counts + 0.1).sum(1, keepdim=True)).log()[previous, following]
    unigram = -((counts.sum(0) + 0.1) / (counts.sum() + 25.6)).log()[following]
    with torch.no_grad():
        loss = model(windows, return_type="loss", loss_per_token=True)[:, 1:].mean()
    share = (unigram.mean() - loss) / (unigram.mean() - bigram.mean())
    assert share >= BIGRAM_SHARE, (float(loss), float(bigram.mean()), float(unigram.mean()))


def test_most_heads_of_the_one_layer_model_are_copying_heads(one):
    scores = copying_scores(process_weights(one), "OV")
    copying = scores.scores[0] > scores.baseline + SIGMAS * scores.baseline_std
    assert copying.sum() > one.cfg.n_heads / 2, scores.scores


def test_the_two_layer_model_has_an_induction_head_in_layer_1(circuit):
    induction = circuit["induction"]
    assert induction[1, circuit["head"]] > MAJORITY > 10 * induction.baseline


def _offset(k):
    def target(tokens):
        batch, n = tokens.shape
        return torch.ones(n - k).diag(-k).expand(batch, n, n)

    return target


def test_its_strongest_k_composition_partner_is_the_layers_previous_token_head(
    two, tokens, circuit
):
    prev = circuit["prev"]
    assert int(circuit["prev_scores"].scores[0].argmax()) == prev
    with torch.no_grad():
        _, cache = two.run_with_cache(tokens, names_filter=lambda n: "pattern" in n)
    by_offset = [detect_head(two, _offset(k), cache, tokens)[0, prev] for k in range(5)]
    assert max(range(5), key=by_offset.__getitem__) == 1, by_offset


@pytest.mark.xfail(strict=True, reason="attn-only-2l's previous-token heads are soft (~0.3)")
def test_its_strongest_k_composition_partner_puts_a_majority_on_the_previous_token(circuit):
    assert circuit["prev_scores"][0, circuit["prev"]] > MAJORITY


def test_k_composition_is_well_above_baseline_and_above_q_and_v(circuit):
    prev, head = circuit["prev"], circuit["head"]
    k, q, v = (float(circuit["composition"][kind].scores[0, prev, 1, head]) for kind in "KQV")
    baseline = circuit["composition"]["K"]
    assert k > baseline.baseline + SIGMAS * baseline.baseline_std
    assert k > q and k > v


def test_zeroing_the_k_composition_partners_removes_the_induction_attention(two, tokens, circuit):
    k = circuit["composition"]["K"]
    scores = k.scores[0, :, 1, circuit["head"]]
    partners = (scores > k.baseline + SIGMAS * k.baseline_std).nonzero().flatten().tolist()

    def zero(z, hook):
        z = z.clone()
        z[:, :, partners] = 0.0
        return z

    with torch.no_grad(), two.hooks(fwd_hooks=[(get_act_name("z", 0), zero)]):
        _, cache = two.run_with_cache(tokens, names_filter=lambda n: "pattern" in n)
    without = induction_scores(two, cache=cache, tokens=tokens)[1, circuit["head"]]
    assert without < MAJORITY < circuit["induction"][1, circuit["head"]]


def test_the_two_layer_model_predicts_the_second_copy(two, tokens):
    first, second = _copy_losses(two, tokens)
    assert second < FAR_BELOW * _order_blind(tokens) < first


def test_the_one_layer_model_does_not_predict_the_second_copy(one, tokens):
    _, second = _copy_losses(one, tokens)
    assert second >= _order_blind(tokens)


def test_late_context_loss_is_below_early_on_heldout_text(two, windows):
    with torch.no_grad():
        chunks = windows.split(64)
        loss = torch.cat([two(c, return_type="loss", loss_per_token=True) for c in chunks])
    difference = loss[:, 96:].mean(1) - loss[:, 8:24].mean(1)
    stderr = difference.std() / len(difference) ** 0.5
    assert difference.mean() < -SIGMAS * stderr


def test_ablating_the_induction_heads_removes_most_in_context_learning(two, tokens, circuit):
    first, second = _copy_losses(two, tokens)
    scores = circuit["induction"].scores[1]
    heads = [(1, h) for h in range(two.cfg.n_heads) if scores[h] > MAJORITY]
    with torch.no_grad():
        logits = pattern_preserving_ablation(two, tokens, heads)
        loss = lm_cross_entropy_loss(logits, tokens, per_token=True).mean(0)
    ablated_icl = float(loss[1:PERIOD].mean() - loss[PERIOD:].mean())
    assert ablated_icl < (1 - MOST) * (first - second)


def _steepest_rise(steps, values):
    rises = [b - a for a, b in itertools.pairwise(values)]
    i = max(range(len(rises)), key=rises.__getitem__)
    return steps[i], steps[i + 1]


def test_induction_and_in_context_learning_rise_in_the_same_window(tokens):
    steps = pretrained_info("attn-only-2l").checkpoints
    induction, icl = [], []
    for step in steps:
        model = HookedTransformer.from_pretrained("attn-only-2l", checkpoint_value=step)
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens, names_filter=lambda n: "pattern" in n)
        induction.append(float(induction_scores(model, cache=cache, tokens=tokens).scores[1].max()))
        first, second = _copy_losses(model, tokens)
        icl.append(first - second)
    assert induction[0] < MAJORITY < induction[-1]  # the checkpoints span the bump
    assert _steepest_rise(steps, induction) == _steepest_rise(steps, icl)
