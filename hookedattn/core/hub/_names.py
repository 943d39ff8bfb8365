"""TransformerLens's model names, and the revisions its checkpoint arguments mean.

TransformerLens loads `gpt2-small`, `pythia-70m` or `attn-only-2l` by an alias of a hub
repo id (`gpt2`, `EleutherAI/pythia-70m`, `NeelNanda/Attn_Only_2L512W_C4_Code`); aliases
are matched without regard to case, as TL matches them. The table (`tl_models.json`) is TL
3.5.1's own, written by `scripts/tl_names.py` from an installed TransformerLens.

`checkpoint_value` / `checkpoint_index` pick a training checkpoint: for Pythia and the
Stanford CRFM GPT-2s a revision of the repo (`step1000`, `checkpoint-1000`), for the
TransformerLens-format toy models a file in it (`hookedattn.core.hub._transformerlens`).
"""

import dataclasses
import difflib
import functools
import json
from pathlib import Path

TABLE_FILE = Path(__file__).with_name("tl_models.json")


@functools.cache
def tl_model_names() -> dict[str, tuple[str, ...]]:
    """TransformerLens's official names (hub repo ids), each with its aliases."""
    models = json.loads(TABLE_FILE.read_text())["models"]
    return {name: tuple(aliases) for name, aliases in models.items()}


@functools.cache
def _by_lower_name() -> dict[str, str]:
    names = {}
    for official, aliases in tl_model_names().items():
        for alias in aliases:
            names[alias.lower()] = official
        names[official.lower()] = official
    return names


def official_name(name: str) -> str | None:
    """The hub repo id TransformerLens means by `name` (an alias or an official name, in
    any case), or None if TransformerLens has no such name."""
    return _by_lower_name().get(name.lower())


def close_names(name: str, n: int = 3) -> list[str]:
    """The TransformerLens names closest to `name` (for a "did you mean")."""
    close = difflib.get_close_matches(name.lower(), list(_by_lower_name()), n=n, cutoff=0.75)
    spelled = {}
    for lower in close:  # an alias as TransformerLens spells it
        official = _by_lower_name()[lower]
        for candidate in (official, *tl_model_names()[official]):
            if candidate.lower() == lower:
                spelled[candidate] = None
    return list(spelled)


@dataclasses.dataclass(frozen=True)
class CheckpointedRepos:
    """Repos whose training checkpoints are revisions: `revision.format(step=...)`."""

    prefix: str
    revision: str
    steps: tuple[int, ...]
    suffix: str = ""

    def holds(self, repo_id: str) -> bool:
        """Whether `repo_id` is one of these repos."""
        return repo_id.startswith(self.prefix) and repo_id.endswith(self.suffix)


_PYTHIA_STEPS = tuple(range(1000, 143_000 + 1, 1000))
CHECKPOINTED: tuple[CheckpointedRepos, ...] = (
    # The first Pythia release (-v0) kept a checkpoint every 1000 steps; the current one
    # also the log-spaced early steps 0, 1, 2, 4, ..., 512.
    CheckpointedRepos("EleutherAI/pythia", "step{step}", _PYTHIA_STEPS, suffix="-v0"),
    CheckpointedRepos(
        "EleutherAI/pythia",
        "step{step}",
        (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, *_PYTHIA_STEPS),
    ),
    CheckpointedRepos(
        "stanford-crfm/",
        "checkpoint-{step}",
        tuple(range(0, 100, 10))
        + tuple(range(100, 2000, 50))
        + tuple(range(2000, 20_000, 100))
        + tuple(range(20_000, 400_000 + 1, 1000)),
    ),
)


def checkpointed_repos(repo_id: str) -> CheckpointedRepos | None:
    """How `repo_id` keeps its checkpoints as revisions, or None if it does not."""
    return next((repos for repos in CHECKPOINTED if repos.holds(repo_id)), None)


def checkpoint_step(
    steps: tuple[int, ...], what: str, checkpoint_index: int | None, checkpoint_value: int | None
) -> int:
    """The step `checkpoint_value` names (one of `steps`) or `checkpoint_index` indexes; a
    ValueError names the bad value and the steps there are."""
    if checkpoint_index is not None and checkpoint_value is not None:
        raise ValueError("give checkpoint_index or checkpoint_value, not both")
    shown = _shown(steps)
    if checkpoint_value is not None:
        if checkpoint_value not in steps:
            raise ValueError(f"{what} has no checkpoint at step {checkpoint_value}; steps: {shown}")
        return checkpoint_value
    if not isinstance(checkpoint_index, int) or not -len(steps) <= checkpoint_index < len(steps):
        raise ValueError(
            f"checkpoint_index {checkpoint_index!r} is out of range: {what} has "
            f"{len(steps)} checkpoints (steps {shown})"
        )
    return steps[checkpoint_index]


def _shown(steps: tuple[int, ...]) -> str:
    if len(steps) <= 12:
        return ", ".join(map(str, steps))
    return f"{', '.join(map(str, steps[:6]))}, ..., {', '.join(map(str, steps[-3:]))}"
