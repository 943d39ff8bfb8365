"""Which of a convention's candidate families computes what `transformers` computes, found
in a few checks instead of one per candidate.

The candidates (`_candidates.candidates`) are every combination of the settings a module
tree cannot show (rotated halves or pairs, an output gate's function, a router's scoring,
...): each doubles them, and AFMoE has 64. Checking them in order costs one import of the
twin each until one passes. Most settings act on their own: a wrong one adds its own error
to the stream. So the search starts from the first candidate and, while it fails, checks
each candidate that differs from it in one setting, moves to the combination of the
settings that brought the twin closer (more points agreeing, or a smaller miss at the same
point: `_verify.Agreement`), and repeats from there. When no single change helps, the
candidates not yet checked are checked in order, so a candidate that passes is never
missed; the search only changes the order. The first candidate that passes is the import;
with none, the first candidate's refusal is raised.
"""

from collections.abc import Callable

from hookedattn.core.hf._family import Family
from hookedattn.core.hf._verify import Agreement

Choices = tuple[tuple[str, object], ...]


def first_passing(
    families: list[Family], check: Callable[[Family], Agreement]
) -> tuple[Family | None, Agreement]:
    """The first of `families` found to pass `check` (the module docstring's order), and
    its agreement; with none, None and the first family's agreement."""
    by_choices = {family.choices: family for family in families}
    checked: dict[Choices, Agreement] = {}

    def agreement(family: Family) -> Agreement:
        if family.choices not in checked:
            checked[family.choices] = check(family)
        return checked[family.choices]

    current = families[0]
    if len(by_choices) == len(families):  # every candidate told apart by its settings
        while agreement(current).error:
            better = _closer(current, by_choices, agreement)
            if not better:
                break
            current = _combined(current, better, by_choices, agreement)
    for family in [current, *families]:
        if not agreement(family).error:
            return family, agreement(family)
    return None, agreement(families[0])


def _closer(
    current: Family, by_choices: dict[Choices, Family], agreement: Callable[[Family], Agreement]
) -> list[Family]:
    """The candidates one setting away from `current` that agree better with the twin, the
    best first."""
    base, better = _rank(agreement(current)), []
    for choices in _one_away(current.choices, by_choices):
        family = by_choices[choices]
        if not agreement(family).error:
            return [family]  # passes: nothing closer to look for
        if _rank(agreement(family)) > base:
            better.append(family)
    return sorted(better, key=lambda f: _rank(agreement(f)), reverse=True)


def _combined(
    current: Family,
    better: list[Family],
    by_choices: dict[Choices, Family],
    agreement: Callable[[Family], Agreement],
) -> Family:
    """The candidate with every improving change of `better` applied to `current` (the
    best one's value where two change one setting), if it agrees better than the best
    single change; else that best single change."""
    settings = dict(current.choices)
    for family in reversed(better):  # the best last, so its value wins
        settings.update(_changed(current.choices, family.choices))
    merged = by_choices.get(tuple(settings.items()))
    if merged is not None and _rank(agreement(merged)) > _rank(agreement(better[0])):
        return merged
    return better[0]


def _one_away(choices: Choices, by_choices: dict[Choices, Family]) -> list[Choices]:
    """The candidates' settings that differ from `choices` in exactly one setting."""
    return [c for c in by_choices if sum(a != b for a, b in zip(c, choices, strict=True)) == 1]


def _changed(before: Choices, after: Choices) -> dict[str, object]:
    """The settings of `after` that differ from `before`."""
    pairs = zip(after, before, strict=True)
    return {name: value for (name, value), (_, old) in pairs if old != value}


def _rank(agreement: Agreement) -> tuple[int, float]:
    """Closer to the twin: more points agreeing, then a smaller miss where it parts."""
    if not agreement.error:
        return (10**9, 0.0)
    return (len(agreement.agreeing), -agreement.miss)
