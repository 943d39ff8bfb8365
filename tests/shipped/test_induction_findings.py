"""The findings of Elhage et al. 2021 and Olsson et al. 2022, checked on the shipped weights.

The measures and thresholds are `analysis.induction`'s, the same that
`python scripts/induction` reports (its *Thresholds* section states each in words);
the repeated sequences here are another random sample than the report's (seed 5). The
criteria were fixed before the shipped models were trained:

- the induction head (the layer-1 head of highest induction score) puts a majority of its
  attention on its target, and that majority is more than 10x the uniform baseline;
- its strongest K-composition partner in layer 0 is a previous-token head: the top
  previous-token score of its layer, attention peaking one back, and a majority of its
  attention on the previous token of repeated random bytes (with `<bos>` first, as in
  training);
- that K-composition is above 2/sqrt(d_model), more than 3 standard deviations above the
  random baseline, and above the same pair's Q- and V-composition;
- zeroing every K-composition partner takes the induction head below a majority;
- ablating the induction heads (zero, patterns kept) removes most of the in-context
  learning; the mean-ablation control removes most of it too;
- the second copy's loss is far below the order-blind bound for two layers, not below it
  for one; late held-out text is predicted better than early text (3 standard errors);
- the 0-layer model gets most of the way from unigram to bigram statistics;
- over training, induction and in-context learning rise in the same window.
"""

import pytest
import torch

from analysis import copying_scores
from analysis.induction import (
    BIGRAM_SHARE,
    FAR_BELOW,
    MAJORITY,
    MOST,
    SIGMAS,
    ablate_heads,
    bigram_comparison,
    checkpoint_scores,
    composition_floor,
    crossing,
    induction_without,
    locate_circuit,
    offset_profile,
    repeat_losses,
    repeated_tokens,
    steepest_rise,
    text_losses,
)
from hookedattn import HookedTransformer, process_weights
from hookedattn.core._pretrained import pretrained_info
from hookedattn.core._weights_io import read_config
from hookedattn.training.corpus import heldout_windows, load_stdlib_corpus

TWO = "bytes-attn-only-2l"
# A criterion the shipped two-layer model fails, by measurement (see the report): strict, so
# that a model that meets it turns its mark into an error until the mark is removed.
RISE_LAGS = pytest.mark.xfail(
    strict=True,
    reason="the ICL leads: its steepest rise between checkpoints 50 apart is 200 steps before "
    "the induction score's, and it passes half its rise 75 steps (3 evaluations) earlier",
)


@pytest.fixture(scope="module")
def corpus():
    return load_stdlib_corpus()


@pytest.fixture(scope="module")
def windows(corpus):
    # 512 windows: with 64 the standard error of the early-minus-late difference (~0.12
    # nats) is as large as the difference itself.
    return heldout_windows(corpus.heldout, 512, 128)


@pytest.fixture(scope="module")
def tokens():
    return repeated_tokens(seed=5)


@pytest.fixture(scope="module")
def two():
    return HookedTransformer.from_pretrained(TWO)


@pytest.fixture(scope="module")
def one():
    return HookedTransformer.from_pretrained("bytes-attn-only-1l")


@pytest.fixture(scope="module")
def cache(two, tokens):
    with torch.no_grad():
        return two.run_with_cache(tokens)


@pytest.fixture(scope="module")
def circuit(two, tokens, cache):
    return locate_circuit(two, tokens, cache[1])


def test_the_zero_layer_model_approximates_the_bigram_statistics(corpus, windows):
    model = HookedTransformer.from_pretrained("bytes-attn-only-0l")
    bigram = bigram_comparison(model, corpus.train, windows)
    assert bigram.share >= BIGRAM_SHARE, bigram


def test_most_heads_of_the_one_layer_model_are_copying_heads(one):
    scores = copying_scores(process_weights(one), "OV")
    assert scores.above_random(SIGMAS)[0].sum() > one.cfg.n_heads / 2, scores.scores


def test_the_two_layer_model_has_an_induction_head_in_layer_1(circuit):
    induction = circuit.induction
    assert induction[1, circuit.induction_head] > MAJORITY > 10 * induction.baseline


def test_its_strongest_k_composition_partner_is_the_layers_previous_token_head(
    two, tokens, cache, circuit
):
    prev = circuit.prev_head
    assert int(circuit.prev_scores.scores[0].argmax()) == prev
    by_offset = offset_profile(two, cache[1], tokens, prev)
    assert max(range(len(by_offset)), key=by_offset.__getitem__) == 1, by_offset


def test_its_strongest_k_composition_partner_puts_a_majority_on_the_previous_token(circuit):
    assert circuit.prev_scores[0, circuit.prev_head] > MAJORITY, circuit.prev_scores.scores[0]


def test_k_composition_is_well_above_baseline_and_above_q_and_v(two, circuit):
    k, q, v = (circuit.composition_of_pair(kind) for kind in "KQV")
    assert k > composition_floor(two.cfg.d_model)
    assert k > circuit.composition["K"].threshold(SIGMAS)
    assert k > q and k > v


def test_zeroing_the_k_composition_partners_removes_the_induction_attention(two, tokens, circuit):
    head = circuit.induction_head
    without = induction_without(two, tokens, circuit.k_partners(), head)
    assert without < MAJORITY < circuit.induction[1, head]


def test_the_two_layer_model_predicts_the_second_copy(tokens, cache):
    losses = repeat_losses(cache[0], tokens)
    assert losses.second < FAR_BELOW * losses.order_blind < losses.first


def test_the_one_layer_model_does_not_predict_the_second_copy(one, tokens):
    with torch.no_grad():
        losses = repeat_losses(one(tokens), tokens)
    assert losses.second >= losses.order_blind


def test_late_context_loss_is_below_early_on_heldout_text(two, windows):
    text = text_losses(two, windows)
    assert text.icl > SIGMAS * text.icl_stderr


def test_ablating_the_induction_heads_removes_most_in_context_learning(two, tokens, cache, circuit):
    clean = repeat_losses(cache[0], tokens)
    heads = [(1, h) for h in circuit.induction_heads()]
    zero = ablate_heads(two, tokens, heads, clean=cache[1])
    mean = ablate_heads(
        two, tokens, heads, method="mean", reference=repeated_tokens(seed=6), clean=cache[1]
    )
    for ablated in (zero, mean):
        assert ablated.icl < (1 - MOST) * clean.icl and not ablated.above_uniform, ablated


@RISE_LAGS
def test_induction_and_in_context_learning_rise_in_the_same_window(tokens):
    scores = checkpoint_scores(TWO, tokens)
    assert scores.induction[0] < MAJORITY < scores.induction[-1]  # they span the change
    assert steepest_rise(scores.steps, scores.induction) == steepest_rise(scores.steps, scores.icl)


@RISE_LAGS
def test_the_training_runs_evaluations_show_both_rising_within_one_evaluation():
    history = read_config(pretrained_info(TWO).path)[1]["history"]
    steps = [e["step"] for e in history]
    induction = [e["induction"] for e in history]
    icl = [e["repeat_first"] - e["repeat_second"] for e in history]
    interval = steps[1] - steps[0]
    assert abs(crossing(steps, induction, 0.5) - crossing(steps, icl, 0.5)) <= interval
