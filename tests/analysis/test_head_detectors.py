"""Head detectors: known answers on hand-built patterns, a brute-force reference, baselines."""

import itertools

import pytest
import torch

from analysis import (
    HeadScores,
    detect_head,
    duplicate_token_scores,
    induction_scores,
    prev_token_scores,
)
from analysis.head_detectors import TARGETS, repeated_random_tokens
from hookedattn import ActivationCache
from hookedattn.testing import tiny_model

# "a b c a b c": a repeated sequence of 3 tokens.
TOKENS = torch.tensor([[0, 1, 2, 0, 1, 2]])
N = 6


def _one_hot_rows(keys):
    """A pattern in which query q attends only to key keys[q]."""
    pattern = torch.zeros(N, N, dtype=torch.float64)
    pattern[torch.arange(N), torch.tensor(keys)] = 1.0
    return pattern


HAND_BUILT = {
    "previous": _one_hot_rows([0, 0, 1, 2, 3, 4]),
    "uniform": torch.ones(N, N, dtype=torch.float64).tril() / torch.arange(1, N + 1)[:, None],
    "self": _one_hot_rows(list(range(N))),
    "induction": _one_hot_rows([0, 1, 2, 1, 2, 3]),  # q >= 3 reads q - 2: after the last copy
    "duplicate": _one_hot_rows([0, 1, 2, 0, 1, 2]),  # q >= 3 reads q - 3: the last copy
}


def _hand_built():
    """A model (for its shape) and a cache holding the hand-built patterns, one per head."""
    fields = dict(n_layers=1, d_model=10, n_heads=5, n_ctx=N, d_vocab=3, attn_only=True)
    pattern = torch.stack(list(HAND_BUILT.values()))[None]  # [batch head query key]
    cache = ActivationCache({"blocks.0.attn.hook_pattern": pattern}, n_layers=1)
    return tiny_model(dtype=torch.float32, **fields), cache


def _scores(result: HeadScores) -> dict[str, float]:
    return {name: result[0, h] for h, name in enumerate(HAND_BUILT)}


def test_previous_token_known_answers():
    model, cache = _hand_built()
    result = prev_token_scores(model, cache)
    baseline = sum(1 / (q + 1) for q in range(1, N)) / (N - 1)
    assert result.baseline == pytest.approx(baseline, abs=1e-12)
    expected = {"previous": 1.0, "uniform": baseline, "self": 0, "induction": 0, "duplicate": 0}
    assert _scores(result) == pytest.approx(expected, abs=1e-12)


def test_duplicate_token_known_answers():
    model, cache = _hand_built()
    result = duplicate_token_scores(model, cache, TOKENS)
    baseline = (1 / 4 + 1 / 5 + 1 / 6) / 3  # queries 3, 4, 5 each have one earlier copy
    assert result.baseline == pytest.approx(baseline, abs=1e-12)
    expected = {"previous": 0, "uniform": baseline, "self": 0, "induction": 0, "duplicate": 1.0}
    assert _scores(result) == pytest.approx(expected, abs=1e-12)


def test_induction_known_answers():
    model, cache = _hand_built()
    result = induction_scores(model, cache=cache, tokens=TOKENS)
    baseline = (1 / 4 + 1 / 5 + 1 / 6) / 3
    assert result.baseline == pytest.approx(baseline, abs=1e-12)
    expected = {"previous": 0, "uniform": baseline, "self": 0, "induction": 1.0, "duplicate": 0}
    assert _scores(result) == pytest.approx(expected, abs=1e-12)


def test_a_user_defined_target():
    model, cache = _hand_built()

    def attends_to_itself(tokens):
        return torch.eye(tokens.shape[1])  # [query key], broadcast over the batch

    result = detect_head(model, attends_to_itself, cache, TOKENS)
    assert result.detector == "attends_to_itself"
    assert result.baseline == pytest.approx(sum(1 / (q + 1) for q in range(N)) / N, abs=1e-12)
    assert _scores(result)["self"] == pytest.approx(1.0, abs=1e-12)
    assert _scores(result)["previous"] == pytest.approx(1 / N, abs=1e-12)  # only query 0


def _random_model(n_ctx=12):
    return tiny_model(n_heads=3, d_head=4, n_ctx=n_ctx, d_vocab=7, d_mlp=16)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_scores_match_a_brute_force_loop(name):
    model = _random_model()
    tokens = torch.randint(0, 7, (3, 12), generator=torch.Generator().manual_seed(0))
    _, cache = model.run_with_cache(tokens)
    result = detect_head(model, name, cache, tokens)
    expected = torch.zeros(2, 3, dtype=torch.float64)
    n_queries = 0
    for b, q in itertools.product(range(3), range(12)):
        t = tokens[b]
        if name == "previous_token":
            keys = [q - 1] if q >= 1 else []
        elif name == "duplicate_token":
            keys = [k for k in range(q) if t[k] == t[q]]
        else:
            keys = [k for k in range(1, q) if t[k - 1] == t[q]]
        if not keys:
            continue
        n_queries += 1
        for layer, head in itertools.product(range(2), range(3)):
            expected[layer, head] += sum(cache["pattern", layer][b, head, q, k] for k in keys)
    torch.testing.assert_close(result.scores, expected / n_queries, rtol=1e-12, atol=1e-12)


def test_heads_that_ignore_their_input_score_the_baseline():
    model = _random_model()
    with torch.no_grad():
        for block in model.blocks:  # zero queries: every score 0, every pattern uniform
            block.attn.W_Q.zero_()
            block.attn.b_Q.zero_()
    for result in (
        induction_scores(model, 6, 2, seed=3, batch=4),
        detect_head(model, "previous_token", seq_len=4, n_repeats=3),
    ):
        expected = torch.full((2, 3), result.baseline, dtype=torch.float64)
        torch.testing.assert_close(result.scores, expected, rtol=1e-12, atol=1e-12)


def test_induction_scores_run_on_repeated_random_tokens():
    model = _random_model()
    tokens = repeated_random_tokens(7, 4, n_repeats=3, seed=5, batch=2)
    assert tokens.shape == (2, 12)
    assert torch.equal(tokens[:, :4], tokens[:, 8:])
    by_default = induction_scores(model, 4, 3, seed=5, batch=2)
    _, cache = model.run_with_cache(tokens)
    # Runs that cache different hook points take different kernels (fused where a point is
    # idle), so the two agree to rounding, not bit for bit.
    torch.testing.assert_close(
        by_default.scores,
        induction_scores(model, cache=cache, tokens=tokens).scores,
        rtol=1e-12,
        atol=1e-12,
    )


def test_errors_name_what_is_missing():
    model, cache = _hand_built()
    with pytest.raises(ValueError, match="previous_token"):
        detect_head(model, "prev", cache)
    with pytest.raises(ValueError, match="pass tokens="):
        detect_head(model, "induction", cache)
    with pytest.raises(ValueError, match="no query position"):
        duplicate_token_scores(model, cache, torch.arange(N)[None])
    with pytest.raises(ValueError, match="target has shape"):
        detect_head(model, lambda tokens: torch.ones(2, 2), cache, TOKENS)


def test_scores_read_back_by_label_and_print():
    model, cache = _hand_built()
    result = induction_scores(model, cache=cache, tokens=TOKENS)
    assert result["L0H3"] == result[0, 3] == pytest.approx(1.0)
    assert result.top(2).rows[0] == ("L0H3", pytest.approx(1.0))
    assert result.top(2).column("head")[1] == "L0H1"  # uniform, above the zeros
    assert result.to_table().columns == ("layer", "H0", "H1", "H2", "H3", "H4")
    assert "induction" in repr(result) and "baseline 0.206" in repr(result)
