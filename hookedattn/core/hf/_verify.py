"""Verified on load: before a folder's weights are read, its architecture is checked on a tiny
twin, once per kind of checkpoint.

The twin (`_tiny`) is the checkpoint's own config class with the same architecture and every
structural option, few layers, small widths and random weights. `transformers` runs it, and
so does our import of it, by the folder route itself (the twin saved with `save_pretrained`,
read back through the family's table); the residual stream is compared at every layer
(`blocks.0.hook_resid_pre` is HF's first hidden state, `blocks.{i}.hook_resid_post` its
`i + 1`-th; its last is after the final norm, our `ln_final.hook_out`), then the logits. The
first point where they part refuses the import (`VerificationError`), naming it and by how
much. Both run in float64: `transformers` in float64 throughout (`float64_throughout`: its
float32 casts lifted, so its norms, softmaxes, routers and rotary angles are float64 too),
ours from the saved float32 weights read in float64. The tolerance is 1e-8 of each tensor's
largest value, far below float32's noise (~1e-7) and far above float64's (~1e-15): a
difference a float32 comparison would hide (a missing soft cap on small logits, an epsilon
of 1e-6 in a sum) refuses the import. What it cannot see: a size-dependent mistake the
twin's sizes hide.

A pass is remembered in `verified.json` in hookedattn's cache folder (`$HOOKEDATTN_CACHE`,
else `$XDG_CACHE_HOME/hookedattn`, else `~/.cache/hookedattn`), keyed by what it depends
on: hookedattn's core (a digest of its source), the `transformers` version, the family, the
architecture and the twin's config (the checkpoint's structure: sizes aside, every field
but names, dtypes and token ids). The next checkpoint of the same structure reads the
memo and builds nothing. Adding a pass drops those of other versions of the core.
"""

import contextlib
import dataclasses
import functools
import gc
import hashlib
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from hookedattn.core.float64 import float64_throughout
from hookedattn.core.hf import _loading, _saved, _tiny
from hookedattn.core.hf._family import Family
from hookedattn.core.hf._table import StateDict

TOLERANCE = 1e-8  # of the largest |value| of each compared tensor, both sides in float64
_TOKENS = (2, 12)  # batch, positions: longer than the twin's windows
_MEMO = "verified.json"
# Config fields that change no forward of given token ids.
_NOT_STRUCTURAL = frozenset(
    ("_name_or_path", "name_or_path", "architectures", "transformers_version", "dtype",
     "torch_dtype", "_attn_implementation", "_attn_implementation_autoset", "use_cache",
     "output_hidden_states", "output_attentions", "return_dict", "_commit_hash", "id2label",
     "label2id", "tokenizer_class")
)  # fmt: skip


class VerificationError(ValueError):
    """Our import of an architecture does not compute what `transformers` computes, on the
    checkpoint's tiny twin: nothing of the checkpoint's weights was read."""


@dataclasses.dataclass(frozen=True)
class Verification:
    """How a checkpoint's architecture was verified before its weights were read.

    `remembered`: the pass was read from the memo (no twin built this time); `worst`: the
    largest relative |Δ| over the compared points, of this pass or the one remembered;
    `seconds`: what this check took.
    """

    architecture: str
    key: str
    remembered: bool
    worst: float
    seconds: float


def verify(
    hf_config: Any,
    family: Family,
    load: Callable[["TwinRun"], Any],
    source: str = "",
    run: "TwinRun | None" = None,
) -> Verification:
    """Verify `family`'s import of the checkpoint whose config is `hf_config` on its tiny
    twin (module docstring), or find its pass in the memo. `load(run)` imports the twin's
    saved folder without verifying it; `source` names the checkpoint in an error; `run`, the twin
    already built and run (`twin_run`), when several candidates are checked on one."""
    start = time.perf_counter()
    twin_config = _twin_config(hf_config, family, source) if run is None else run.config
    key = memo_key(family, twin_config)
    memo = _read_memo().get(key)
    if memo is not None:
        seconds = time.perf_counter() - start
        return Verification(family.architecture, key, True, memo["worst"], seconds)
    if run is None:
        with twin_run(hf_config, family.architecture, source) as run:
            agreement = measure(family, run, load)
    else:
        agreement = measure(family, run, load)
    if agreement.error:
        raise VerificationError(agreement.error)
    return passed(family, run.config, agreement, time.perf_counter() - start)


def passed(
    family: Family, twin_config: Any, agreement: "Agreement", seconds: float
) -> Verification:
    """Remember `family`'s pass on the twin of `twin_config` (`agreement`, which took
    `seconds`), and return it as a verification."""
    key = memo_key(family, twin_config)
    _remember(key, dict(architecture=family.architecture, worst=agreement.worst, seconds=seconds))
    return Verification(family.architecture, key, False, agreement.worst, seconds)


def _twin_config(hf_config: Any, family: Family | None, source: str) -> Any:
    try:
        return _tiny.tiny_config(hf_config)
    except Exception as error:
        name = source or (family.architecture if family else type(hf_config).__name__)
        raise VerificationError(
            f"could not shrink the config of {name} to a tiny twin "
            f"({type(error).__name__}: {error}); verify=False loads it unverified"
        ) from error


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """Python's cyclic garbage collector paused for an import, then restored as it was.

    Recognising a checkpoint and verifying it build and drop many module trees (HF's
    probes, a model per candidate family: Llama 4 checks 19), which only the collector
    frees. Their allocations set off collections of the oldest generation, each a walk over
    every object the process holds (torch's and transformers': ~0.1 s apiece here). Paused,
    the few megabytes of tiny models wait for the next ordinary collection, which frees them
    in one pass over the young objects.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@dataclasses.dataclass(frozen=True)
class TwinRun:
    """A checkpoint's tiny twin, built, saved in `folder` and run by `transformers` once, so
    that every candidate family is checked against the same run: `tokens` in, `hidden`
    (its hidden states) and `logits` out. `what` names it in an error. A candidate reads
    the folder's config and names, and its `tensors`, read once."""

    config: Any
    folder: Path
    tensors: Any  # the folder's tensors read once (a `StateDict`), for every candidate
    tokens: torch.Tensor
    hidden: tuple[torch.Tensor, ...]
    logits: torch.Tensor
    what: str


@contextlib.contextmanager
def twin_run(hf_config: Any, architecture: str, source: str = "") -> Iterator[TwinRun]:
    """Build the twin of `hf_config` (as class `architecture`), save it and run it; the
    folder lasts as long as the context. A twin that cannot be built raises a
    `VerificationError`."""
    config = _twin_config(hf_config, None, source or architecture)
    transformers = _loading.transformers_module()
    what = f"the tiny twin of {source or architecture}"
    with tempfile.TemporaryDirectory(prefix="hookedattn-twin-") as folder:
        try:
            with torch.random.fork_rng(devices=[]):  # HF's initialisation draws from it
                twin = _tiny.random_hf_model(getattr(transformers, architecture), config)
            _saved.save_twin(twin, Path(folder))  # each rank of a torchrun job its own
            generator = torch.Generator().manual_seed(0)
            tokens = torch.randint(0, config.vocab_size, _TOKENS, generator=generator)
            with torch.no_grad(), float64_throughout():
                hf = twin.double()(tokens, output_hidden_states=True)
        except Exception as error:
            raise VerificationError(
                f"could not verify the import of {architecture} on {what}: "
                f"{type(error).__name__}: {error}; verify=False loads it unverified"
            ) from error
        saved = _loading.weight_source(Path(folder))
        tensors = StateDict({name: saved.get(name).clone() for name in saved.shapes})
        hidden = tuple(hf.hidden_states)
        yield TwinRun(config, Path(folder), tensors, tokens, hidden, hf.logits, what)


@dataclasses.dataclass(frozen=True)
class Agreement:
    """How far one family's import of a twin agrees with `transformers`: `agreeing`, the
    points (in the forward's order) within the tolerance before the first that is not;
    `error`, the refusal naming that point ("" when every point agrees); `worst`, the
    largest relative |Δ| of the agreeing points; `miss`, the relative root-mean-square |Δ|
    at the parting point (0 when none), which the candidate search compares."""

    agreeing: tuple[str, ...]
    error: str
    worst: float
    miss: float


def measure(family: Family, run: TwinRun, load: Callable[[TwinRun], Any]) -> Agreement:
    """`family`'s import of `run`'s twin (by the folder route, `load`) against the twin's
    run, point by point; an import that fails outright agrees nowhere."""
    try:
        ours = load(run)
        points = _points(ours, run.hidden, embedding_first=True)
        later = _points(ours, run.hidden, embedding_first=False)
        with torch.no_grad():
            logits, cache = ours.run_with_cache(run.tokens, names_filter=[*points, *later])
        if _embedding_left_out(cache, run.hidden[0]):
            points = later
    except Exception as error:
        message = (
            f"could not verify the import of {family.architecture} on {run.what}: "
            f"{type(error).__name__}: {error}; verify=False loads it unverified"
        )
        return Agreement((), message, float("inf"), float("inf"))
    compared = [(name, label, cache[name], expected) for name, (label, expected) in points.items()]
    compared.append(("logits", "logits", logits, run.logits))
    worst, agreeing = 0.0, []
    for name, label, got, expected in compared:
        scale = float(expected.abs().max()) or 1.0
        delta = float((got - expected).abs().max())
        if not delta <= TOLERANCE * scale:  # NaN parts too
            where = f"our {name} parts from transformers' {label}"
            error = _parting(family, run.what, where, delta, scale, agreeing, run.config)
            miss = float((got - expected).norm() / (expected.norm() or 1.0))
            return Agreement(tuple(agreeing), error, worst, miss if miss == miss else 1e30)
        worst, agreeing = max(worst, delta / scale), [*agreeing, name]
    return Agreement(tuple(agreeing), "", worst, 0.0)


def _points(
    ours: Any, hidden: tuple[torch.Tensor, ...], embedding_first: bool
) -> dict[str, tuple[str, torch.Tensor]]:
    """Our hook point -> the HF hidden state it must equal (its label, the tensor), in the
    order of the forward: the stream entering each layer and the final norm's output; or
    (not `embedding_first`: Mamba's, Falcon Mamba's) each layer's output and the final
    norm's, the embedding left out."""
    n = ours.cfg.n_layers
    if len(hidden) != n + 1:
        raise ValueError(f"transformers returned {len(hidden)} hidden states for {n} layers")
    final = "ln_final.hook_out" if "ln_final.hook_out" in ours.hook_dict else None
    first = ["blocks.0.hook_resid_pre"] if embedding_first else []
    last = n - 1 if embedding_first else n
    names = [*first, *(f"blocks.{i}.hook_resid_post" for i in range(last))]
    names.append(final or f"blocks.{n - 1}.hook_resid_post")
    return {name: (f"hidden_states[{i}]", hidden[i]) for i, name in enumerate(names)}


def _embedding_left_out(cache: Any, first: torch.Tensor) -> bool:
    """Whether HF's first hidden state is our first layer's output rather than its input."""
    distance = {name: float((cache[name] - first).abs().max())
                for name in ("blocks.0.hook_resid_pre", "blocks.0.hook_resid_post")}  # fmt: skip
    return distance["blocks.0.hook_resid_post"] < distance["blocks.0.hook_resid_pre"]


def _parting(
    family: Family,
    what: str,
    where: str,
    delta: float,
    scale: float,
    agreeing: list[str],
    config: Any,
) -> str:
    agreed = f" (the points before it agree: {', '.join(_fewer(agreeing))})" if agreeing else ""
    return (
        f"the import of {family.architecture} does not compute what transformers "
        f"{_loading.transformers_module().__version__} computes: on {what} "
        f"({config.num_hidden_layers} layers, random weights) {where} by {delta:.3g} "
        f"(max |Δ|, {delta / scale:.3g} of its largest value {scale:.3g}; tolerance "
        f"{TOLERANCE:g}){agreed}. No weights were read. The family's table or config "
        f"translation is wrong for this checkpoint; verify=False loads it unverified"
    )


def _fewer(names: list[str]) -> list[str]:
    """`names`, or the first and the last two where there are many."""
    return names if len(names) <= 4 else [names[0], "...", *names[-2:]]


def memo_key(family: Family, twin_config: Any) -> str:
    """The memo's key of a twin: a digest of everything the verification depends on."""
    return structure_key(
        twin_config,
        family=[_qualified(family.fields), _qualified(family.table)],
        architecture=family.architecture,
        variant=family.variant,
    )


def structure_key(twin_config: Any, **parts: Any) -> str:
    """A digest of hookedattn's core, the `transformers` version, a twin's structure (its
    config, names, dtypes and token ids aside) and `parts`."""
    structure = {
        k: v for k, v in twin_config.to_dict().items()
        if k not in _NOT_STRUCTURAL and not k.endswith(("_token_id", "_token_ids"))
    }  # fmt: skip
    parts |= dict(
        hookedattn=_code_digest(),
        transformers=_loading.transformers_module().__version__,
        structure=structure,
    )
    text = json.dumps(parts, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def first_remembered(families: list[Family], hf_config: Any) -> Family | None:
    """The first of `families` whose import of a checkpoint of `hf_config`'s structure has
    passed before (memo reads; nothing is built), or None."""
    try:
        twin_config = _tiny.tiny_config(hf_config)
    except Exception:
        return None
    memo = read_memo()
    return next((f for f in families if memo_key(f, twin_config) in memo), None)


def _qualified(function: Callable[..., Any]) -> str:
    return f"{function.__module__}.{function.__qualname__}"


@functools.cache
def _code_digest() -> str:
    """A digest of hookedattn's core (the model and the importers): a pass holds for this
    code only."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def cache_folder() -> Path:
    """hookedattn's cache folder: `$HOOKEDATTN_CACHE`, else `$XDG_CACHE_HOME/hookedattn`,
    else `~/.cache/hookedattn`."""
    if os.environ.get("HOOKEDATTN_CACHE"):
        return Path(os.environ["HOOKEDATTN_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "hookedattn"


def _sections() -> dict[str, Any]:
    try:
        sections = json.loads((cache_folder() / _MEMO).read_text())
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: verify again
    return sections if isinstance(sections, dict) else {}


def read_memo(section: str = "passes") -> dict[str, Any]:
    """One section of the memo: "passes" (verifications), "anatomies" (`_anatomy`)."""
    entries = _sections().get(section, {})
    return entries if isinstance(entries, dict) else {}


def _read_memo() -> dict[str, Any]:
    return read_memo()


def remember(key: str, entry: dict[str, Any], section: str = "passes") -> None:
    """Add an entry to a section of the memo (written whole, then renamed into place),
    dropping the entries of other versions of the core; a cache folder that cannot be
    written only means the next load works it out again."""
    folder = cache_folder()
    entry = entry | dict(
        transformers=_loading.transformers_module().__version__, code=_code_digest()
    )
    sections = {
        name: {k: v for k, v in entries.items()
               if isinstance(v, dict) and v.get("code") == _code_digest()}
        for name, entries in _sections().items() if isinstance(entries, dict)
    }  # fmt: skip
    sections.setdefault(section, {})[key] = entry
    try:
        folder.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=folder, prefix=".verified-", suffix=".tmp")
        with os.fdopen(handle, "w") as file:
            json.dump(sections, file, indent=1, sort_keys=True)
        os.replace(temporary, folder / _MEMO)
    except OSError:
        pass


def _remember(key: str, entry: dict[str, Any]) -> None:
    remember(key, entry)
