"""The candidate search (`hookedattn.core.hf._search`): which of a convention's candidates
passes, found in fewer checks than trying them in order, and never missed."""

import itertools

import pytest
import transformers

from hookedattn import HookedTransformer
from hookedattn.core.hf import _search, _tiny, _verify
from hookedattn.core.hf._family import Family

AXES = ("a", "b", "c", "d", "e")


def families(axes: tuple[str, ...] = AXES) -> list[Family]:
    """Every combination of two values per setting, as `_candidates.candidates` makes."""
    combinations = itertools.product((0, 1), repeat=len(axes))
    return [
        Family("Arch", "arch", dict, dict, str(v), choices=tuple(zip(axes, v, strict=True)))
        for v in combinations
    ]


def additive(truth: dict[str, int], points: int = 3):
    """A check whose miss is the sum of each wrong setting's own error (settings acting on
    their own, as most do), counting its calls."""
    calls = []

    def check(family: Family) -> _verify.Agreement:
        calls.append(family.choices)
        wrong = [name for name, value in family.choices if truth[name] != value]
        if not wrong:
            return _verify.Agreement(tuple(f"p{i}" for i in range(points)), "", 0.0, 0.0)
        miss = sum(1.0 + AXES.index(name) for name in wrong)
        return _verify.Agreement(("p0",), f"parts at p1 ({wrong})", 0.0, miss)

    return check, calls


def test_the_search_finds_the_passing_candidate_in_fewer_checks_than_the_order():
    truth = {"a": 1, "b": 0, "c": 1, "d": 1, "e": 0}
    check, calls = additive(truth)
    candidates = families()
    found, agreement = _search.first_passing(candidates, check)
    in_order = next(i for i, f in enumerate(candidates) if dict(f.choices) == truth) + 1
    assert dict(found.choices) == truth and not agreement.error
    assert len(calls) <= len(AXES) + 2 < in_order


def test_a_candidate_no_single_change_leads_to_is_still_found():
    truth = {"a": 1, "b": 1, "c": 0, "d": 0, "e": 1}
    calls = []

    def check(family: Family) -> _verify.Agreement:  # no partial credit: a needle
        calls.append(family.choices)
        if dict(family.choices) == truth:
            return _verify.Agreement(("p0", "p1"), "", 0.0, 0.0)
        return _verify.Agreement((), "parts at p0", 0.0, 1.0)

    found, _ = _search.first_passing(families(), check)
    assert dict(found.choices) == truth
    assert len(set(calls)) == len(calls)  # each candidate checked once at most


def test_with_no_candidate_passing_the_first_ones_refusal_is_returned():
    def check(family: Family) -> _verify.Agreement:
        return _verify.Agreement((), f"refused {family.variant}", 0.0, 1.0)

    candidates = families()
    found, agreement = _search.first_passing(candidates, check)
    assert found is None and agreement.error == f"refused {candidates[0].variant}"


def test_the_first_candidate_passing_is_taken_without_other_checks():
    check, calls = additive(dict.fromkeys(AXES, 0))
    found, _ = _search.first_passing(families(), check)
    assert dict(found.choices) == dict.fromkeys(AXES, 0) and len(calls) == 1


@pytest.mark.parametrize("model_type", ["afmoe"])
def test_an_architecture_of_many_candidates_is_verified_in_few_checks(
    model_type, monkeypatch, tmp_path
):
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    monkeypatch.setenv("HOOKEDATTN_CACHE", str(tmp_path / "cache"))  # nothing remembered

    model_class = getattr(transformers, MODEL_FOR_CAUSAL_LM_MAPPING_NAMES[model_type])
    config = _tiny.tiny_config(transformers.AutoConfig.for_model(model_type))
    twin = _tiny.random_hf_model(model_class, config, seed=1)
    measured = []
    measure = _verify.measure

    def counted(family, run, load):
        measured.append(family.choices)
        return measure(family, run, load)

    monkeypatch.setattr(_verify, "measure", counted)
    model = HookedTransformer.from_hf(twin)
    assert model.verification is not None and not model.verification.remembered
    assert len(measured) <= 10  # of 64 candidates; in order, the 33rd passes
