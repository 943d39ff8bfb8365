"""Which of `transformers`' causal LMs hookedattn imports, measured on tiny random models.

    python scripts/coverage.py                    # every architecture: writes the two files below
    python scripts/coverage.py --only GPT2LMHeadModel llama --out /tmp/c.json
    python scripts/coverage.py --sample 10 --seed 0

For every entry of `transformers`' `MODEL_FOR_CAUSAL_LM_MAPPING_NAMES` (a model type and its
causal-LM class): its config class's defaults shrunk to a tiny twin (`hookedattn.core.hf.
_tiny`: 2 layers or the few a per-layer pattern needs, d_model 64, 4 heads, every window,
expert count and per-layer list shrunk with them; `OVERRIDES` there where the generic shrink
fails), built with random weights, run forward; then `HookedTransformer.from_hf(model)` in
float32 and float64, its logits against HF's (max |Δ| over the logits' largest |value|),
and greedy generation of 4 tokens against HF's `generate`. Each entry runs in a forked
process with a time and memory limit, so one hang or crash cannot stop the sweep.

An entry imports exactly when the float32 |Δ| is at most 1e-4 of the logits' scale, the
float64 one at most 1e-5, or at most HF's own float64 logits' distance from its float32
ones where that is larger (the float32 rounding a step amplifies: Qwen3-Next's gated delta
rule), and the generated tokens are HF's. The float64 reference is HF's float64 model run
in float64 throughout (`hookedattn.testing.float64_throughout`: stock HF rounds its
RMSNorms, softmaxes and rotary angles to float32 whatever the dtype); the |Δ| from stock
HF's float64 logits is kept beside it. Refused when `from_hf` says it cannot
import it (the message is kept); wrong when it imports but its numbers differ; failed when
the import or its forward raised something else (ours to fix). For what is not imported,
the supported family nearest to it is measured twice: by the names of its tensors (layer
indices aside) against each family's own tiny twin, and by importing it as that family
(its config translated, its tensors checked against the family's table, its logits).

A full run writes `scripts/data/coverage.json` and `docs/guide/coverage.md`; a partial one
(`--only`, `--sample`) writes where `--out` / `--docs` say, else only prints.
"""

import argparse
import contextlib
import copy
import dataclasses
import importlib
import inspect
import json
import multiprocessing
import os
import random
import re
import resource
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

import _coverage_page  # scripts/_coverage_page.py (this script's folder is on sys.path)
import torch
import transformers
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from hookedattn import HookedTransformer
from hookedattn.core import hf
from hookedattn.core._weights_io import CheckpointError
from hookedattn.core.hf import _tiny
from hookedattn.core.hf._importer import families_of_config
from hookedattn.core.hf._table import StateDict
from hookedattn.testing import float64_throughout

ROOT = Path(__file__).resolve().parents[1]
JSON, DOCS = ROOT / "scripts/data/coverage.json", ROOT / "docs/guide/coverage.md"
TOLERANCE_32, TOLERANCE_64 = 1e-4, 1e-5  # of the logits' largest |value|
TOKENS, PROMPT, NEW_TOKENS = (2, 12), 6, 4
MAX_PARAMETERS = 20_000_000  # a shrink that left something large is not tiny
MEMORY_LIMIT = 8 << 30  # bytes of address space per entry's process
LISTED = 10  # tensor names kept per list in the record (the counts are whole)


@dataclasses.dataclass(frozen=True)
class Entry:
    model_type: str
    architecture: str


def entries(only: list[str], sample: int, seed: int) -> list[Entry]:
    """The registered causal LMs, or those `only` names (class or model type), or `sample`
    of them drawn with `seed`."""
    every = [Entry(t, a) for t, a in sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items())]
    if only:
        unknown = set(only) - {n for e in every for n in (e.model_type, e.architecture)}
        if unknown:
            raise SystemExit(f"not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES: {sorted(unknown)}")
        every = [e for e in every if {e.model_type, e.architecture} & set(only)]
    if sample:
        every = sorted(random.Random(seed).sample(every, min(sample, len(every))), key=str)
    return every


# ---------------------------------------------------------------- one entry, in its own process
def measure(entry: Entry) -> dict[str, Any]:
    """Everything measured of one entry (the module docstring's steps)."""
    record: dict[str, Any] = dict(model_type=entry.model_type, architecture=entry.architecture)
    stage = "config"
    try:
        model_class = getattr(transformers, entry.architecture)
        config = model_config(model_class, transformers.CONFIG_MAPPING[entry.model_type]())
        as_decoder(model_class, config)
        stage = "shrink"
        tiny = _tiny.tiny_config(config)
        stage = "build"
        model = build(model_class, tiny)
        stage = "forward"
        vocab = tiny.get_text_config().vocab_size
        tokens = torch.randint(0, vocab, TOKENS, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            logits = model(tokens).logits
        if not torch.isfinite(logits).all():
            raise ValueError("the logits are not finite")
    except Exception as error:
        return record | dict(builds_tiny=False, why_not=f"{stage}: {_short(error)}")
    record |= dict(
        builds_tiny=True,
        layers=getattr(tiny.get_text_config(), "num_hidden_layers", None),
        parameters=sum(p.numel() for p in model.parameters()),
        tensors=templates(model),
    )
    return record | imported(model, tokens, logits)


def model_config(model_class: Any, config: Any) -> Any:
    """The config `model_class` is built from: `config`, or the part of it the class takes
    (a multimodal or composite config's text or decoder config)."""
    wanted = getattr(model_class, "config_class", None)
    if wanted is None or isinstance(config, wanted):
        return config
    parts = [getattr(config, name, None) for name in config.sub_configs]
    return next((part for part in parts if isinstance(part, wanted)), config)


def as_decoder(model_class: Any, config: Any) -> None:
    """`is_decoder=True` where the causal-LM class reads it to be one (BERT-likes, whose
    attention is otherwise bidirectional: a causal LM's checkpoint sets it)."""
    with contextlib.suppress(OSError, TypeError):
        asks = "is_decoder" in inspect.getsource(model_class.__init__)
        if getattr(config, "is_decoder", None) is False and asks:
            config.is_decoder = True


def build(model_class: Any, config: Any) -> Any:
    """The tiny model, after checking on the meta device (where it can be built there)
    that it is tiny."""
    count = 0
    with contextlib.suppress(Exception), torch.device("meta"):
        count = sum(p.numel() for p in model_class(copy.deepcopy(config)).parameters())
    if count > MAX_PARAMETERS:
        raise ValueError(f"{count:,} parameters after the shrink: not tiny")
    return _tiny.random_hf_model(model_class, config)


def imported(model: Any, tokens: torch.Tensor, logits: torch.Tensor) -> dict[str, Any]:
    """The import: refused, failed, wrong or exact, with the float32 and float64 |Δ| and
    greedy generation; for what is not imported, the families it was measured against."""
    try:
        ours = HookedTransformer.from_hf(model)
        delta32 = _relative(ours(tokens), logits)
    except (ValueError, CheckpointError) as error:
        return dict(status="refused", message=_refusal(error), as_family=as_families(model))
    except Exception as error:
        return dict(status="failed", message=_short(error), as_family=as_families(model))
    out = dict(delta_float32=delta32, **_float64_deltas(model, tokens, logits))
    out["folder"] = _folder_family(model.config)
    out["verified"] = _verified_on_load(model) if out["folder"] else None
    out["generation"] = _generation(model, ours, tokens)
    out["per_head"] = _per_head(ours, tokens)
    exact = (
        delta32 <= TOLERANCE_32
        and (out["delta_float64"] or 1.0) <= max(TOLERANCE_64, out["hf_float32_gap"] or 0.0)
        and out["generation"] == "equal"
    )
    return out | dict(status="exact" if exact else "wrong")


PER_HEAD = ("hook_q", "hook_k", "hook_v", "hook_z", "hook_attn_scores", "hook_pattern",
            "hook_result")  # fmt: skip


def _per_head(ours: Any, tokens: torch.Tensor) -> str:
    """The attention hook points whose cached value holds a slice per head (a head axis:
    four axes), and in how many of the layers (a mixer's layer has none)."""

    def attention_point(name: str) -> bool:
        return ".attn." in name and name.rsplit(".", 1)[-1] in PER_HEAD

    with torch.no_grad():
        _, cache = ours.run_with_cache(tokens, names_filter=attention_point)
    headed = [name for name, value in cache.items() if value.ndim == 4]
    layers = {name.split(".")[1] for name in headed}
    kinds = [k.removeprefix("hook_") for k in PER_HEAD if any(n.endswith(k) for n in headed)]
    return f"{' '.join(kinds) or 'none'} ({len(layers)} of {ours.cfg.n_layers} layers)"


def _folder_family(config: Any) -> bool:
    """Whether a folder of this model type finds its family (by `model_type`, where a live
    model is found by its class)."""
    try:
        families_of_config(config)
    except ValueError:
        return False
    return True


def _verified_on_load(model: Any) -> dict[str, Any]:
    """The folder route's verification on load of the model saved: it builds its own twin
    of the saved config, runs it in `transformers` and in ours in float64 and compares every
    layer's stream (`hf._verify`), with a memo of its own so that nothing is remembered:
    `passed` with its largest relative |Δ| and its seconds, or `refused` and why."""
    with tempfile.TemporaryDirectory(prefix="hookedattn-coverage-") as folder:
        model.save_pretrained(Path(folder) / "model")
        previous = os.environ.get("HOOKEDATTN_CACHE")
        os.environ["HOOKEDATTN_CACHE"] = str(Path(folder) / "cache")
        try:
            verification = HookedTransformer.from_hf(Path(folder) / "model").verification
        except Exception as error:
            return dict(status="refused", message=_short(error))
        finally:
            os.environ.pop("HOOKEDATTN_CACHE")
            if previous is not None:
                os.environ["HOOKEDATTN_CACHE"] = previous
    return dict(status="passed", worst=verification.worst, seconds=round(verification.seconds, 3))


def _float64_deltas(model: Any, tokens: torch.Tensor, logits: torch.Tensor) -> dict[str, Any]:
    """Our float64 import's |Δ| from HF's float64 logits computed in float64 throughout
    (`float64_throughout`: its float32 casts lifted), `delta_float64`; from stock HF's
    float64 logits, which round its norms, softmaxes and rotary angles to float32,
    `delta_float64_stock`; and how far HF's float64-throughout logits are from its float32
    ones, `logits` (`hf_float32_gap`: the float32 rounding of the model itself, which an
    amplifying step such as Qwen3-Next's gated delta rule carries past `TOLERANCE_64`)."""
    try:
        model64 = copy.deepcopy(model).double()
        with torch.no_grad():
            stock = _float64_logits(model64, tokens)
            with float64_throughout():
                expected = model64(tokens).logits
        ours = HookedTransformer.from_hf(model64)(tokens)
        return dict(
            delta_float64=_relative(ours, expected),
            delta_float64_stock=_relative(ours, stock),
            hf_float32_gap=_relative(logits.double(), expected),
        )
    except Exception:
        return dict(delta_float64=None, delta_float64_stock=None, hf_float32_gap=None)


def _float64_logits(model64: Any, tokens: torch.Tensor) -> torch.Tensor:
    """Stock HF's float64 logits; where its forward makes a float32 constant too small for a
    float64 value (XGLM's mask fill `torch.full((), finfo(float64).min)`), run again with
    float64 as the default dtype."""
    try:
        return model64(tokens).logits
    except RuntimeError:
        default = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            return model64(tokens).logits
        finally:
            torch.set_default_dtype(default)


def _generation(model: Any, ours: Any, tokens: torch.Tensor) -> str:
    prompt = tokens[:, :PROMPT]
    try:
        # Plain greedy decoding: every token asked for, no processor of the logits (the
        # configs of some decoders force their end token last, or forbid repeats).
        for field in ("eos_token_id", "forced_eos_token_id", "forced_bos_token_id",
                      "no_repeat_ngram_size", "encoder_no_repeat_ngram_size",
                      "repetition_penalty", "min_length", "min_new_tokens", "suppress_tokens",
                      "begin_suppress_tokens", "bad_words_ids"):  # fmt: skip
            setattr(model.generation_config, field, None)
        expected = model.generate(
            prompt, max_new_tokens=NEW_TOKENS, do_sample=False, pad_token_id=0
        )
        got = ours.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False, stop_at_eos=False)
    except Exception as error:
        return f"error: {_short(error)}"
    return "equal" if torch.equal(got, expected) else "differs"


def as_families(model: Any) -> dict[str, Any]:
    """How far each supported family is from importing `model`: the stage its translation
    reaches (config, table, tensors, logits) and what stops it, or its |Δ|."""
    return {family.architecture: as_family(family, model) for family in hf.FAMILIES}


def as_family(family: hf.Family, model: Any) -> dict[str, Any]:
    config = model.config
    try:
        cfg = family.config(config)
        table = family.table(config, cfg, model)
    except Exception as error:
        return dict(stage="config", message=_short(error, 160))
    source = StateDict(model.state_dict())
    names = table.source_names(source.shapes)
    read = set(names.values())
    missing = {_template(hf) for hf, stored in names.items() if stored not in source.shapes}
    extra = {
        _template(n)
        for n in source.shapes
        if n not in read and not any(re.search(p, n) for p in table.ignored)
    }
    if missing or extra:
        return dict(stage="tensors", **apart(missing, extra))
    renamed = dataclasses.replace(
        family, architecture=type(model).__name__, model_type=config.model_type
    )
    hf.register_family(renamed)
    try:
        ours = HookedTransformer.from_hf(model)
        tokens = torch.randint(0, cfg.d_vocab, TOKENS, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            return dict(stage="logits", delta_float32=_relative(ours(tokens), model(tokens).logits))
    except Exception as error:
        return dict(stage="tensors", message=_short(error, 160))
    finally:
        hf.unregister_family(renamed)


def apart(missing: set[str], unexpected: set[str]) -> dict[str, Any]:
    """How an architecture's tensor names differ from a family's: how many of the family's
    it lacks and how many of its own it adds, with the first `LISTED` of each."""
    return dict(
        missing=len(missing),
        unexpected=len(unexpected),
        missing_names=sorted(missing)[:LISTED],
        unexpected_names=sorted(unexpected)[:LISTED],
    )


def templates(model: Any) -> list[str]:
    """The names of the model's tensors with layer and expert indices as `*`."""
    return sorted({_template(name) for name in model.state_dict()})


def _template(name: str) -> str:
    return re.sub(r"(?<=\.)\d+(?=\.|$)", "*", name)


def _relative(got: torch.Tensor, expected: torch.Tensor) -> float:
    got, expected = got.detach().double(), expected.detach().double()
    return float((got - expected).abs().max() / expected.abs().max())


def _refusal(error: Exception) -> str:
    # The unsupported-architecture message lists every family written out; the entry needs
    # why the convention did not recognise it, or else the message's start.
    text = _short(error, limit=2000)
    if "nor is it imported by convention: " in text:
        reason = text.split("nor is it imported by convention: ", 1)[1]
        return f"{type(error).__name__}: not recognised by convention: {reason[:300]}"
    return text.split(": from_hf supports")[0]


def _short(error: Exception, limit: int = 300) -> str:
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


# ---------------------------------------------------------------- the sweep
def run_forked(job: Any, argument: Any, timeout: float) -> dict[str, Any]:
    """`job(argument)` in a forked process with a memory limit, or what stopped it."""
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_child, args=(job, argument, send), daemon=True)
    process.start()
    send.close()
    try:
        answered = receive.poll(timeout)
        result = receive.recv() if answered else dict(error=f"timed out ({timeout:.0f} s)")
    except EOFError:  # it died without an answer
        result = None
    process.join(5)
    if process.is_alive():
        process.kill()
        process.join()
    return result or dict(error=f"the process died (exit code {process.exitcode})")


def _child(job: Any, argument: Any, send: Any) -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.simplefilter("ignore")
    with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
        try:
            result = job(argument)
        except BaseException as error:  # MemoryError, a stray SystemExit
            result = dict(error=_short(error))
    send.send(result)


def family_templates(_: Any) -> dict[str, list[str]]:
    """Each supported family's tensor names, from the tiny twin of its default config."""
    out = {}
    for family in hf.FAMILIES:
        config = _tiny.tiny_config(transformers.CONFIG_MAPPING[family.model_type]())
        out[family.architecture] = templates(build(getattr(transformers, family.architecture),
                                                   config))  # fmt: skip
    return out


def nearest(record: dict[str, Any], families: dict[str, list[str]]) -> dict[str, Any] | None:
    """The supported family whose tensor names differ least from the entry's, and how."""
    if "tensors" not in record or record.get("status") in ("exact", "wrong"):
        return None
    own = set(record["tensors"])
    best = min(families, key=lambda f: len(own ^ set(families[f])))
    theirs = set(families[best])
    if not own & theirs:
        return None
    return dict(family=best, **apart(theirs - own, own - theirs))


def closest_import(record: dict[str, Any], by_names: str | None) -> dict[str, Any] | None:
    """Of the families the entry was imported as, the one that got furthest: to its
    logits (the smallest |Δ|), else to its tensors (the fewest names apart), else (no
    further than its config) the family nearest by names."""
    tried = record.pop("as_family", None)
    if not tried:
        return None
    rank = {"logits": 0, "tensors": 1, "config": 2}

    def distance(family: str) -> tuple[int, float, bool]:
        result = tried[family]
        names_apart = result.get("missing", 0) + result.get("unexpected", 0)
        return rank[result["stage"]], result.get("delta_float32", names_apart), family != by_names

    best = min(tried, key=distance)
    return dict(family=best, **tried[best])


def counts(records: list[dict[str, Any]]) -> dict[str, int]:
    status = [r.get("status") for r in records]
    return dict(
        registered=len(records),
        builds_tiny=sum(bool(r.get("builds_tiny")) for r in records),
        exact=status.count("exact"),
        exact_float32_1e5=sum(_within(r, "delta_float32", 1e-5) for r in records),
        exact_float64_1e10=sum(_within(r, "delta_float64", 1e-10) for r in records),
        verified_on_load=sum(
            r.get("status") == "exact" and (r.get("verified") or {}).get("status") == "passed"
            for r in records
        ),
        refused=status.count("refused"),
        wrong=status.count("wrong"),
        failed=status.count("failed"),
        stopped=sum("error" in r for r in records),
    )


def _within(record: dict[str, Any], field: str, bound: float) -> bool:
    """Whether an exact import's |Δ| (`field`) is at most `bound`."""
    delta = record.get(field)
    return record.get("status") == "exact" and delta is not None and delta <= bound


def sweep(chosen: list[Entry], timeout: float) -> dict[str, Any]:
    # What every entry's forked process imports (transformers' model loading brings in
    # DTensors and torch's compiler, 1.5 to 2.5 s), imported here once, before forking.
    importlib.import_module("transformers.modeling_utils")
    start = time.perf_counter()
    families = run_forked(family_templates, None, timeout * 4)
    records = []
    for i, entry in enumerate(chosen, 1):
        t = time.perf_counter()
        record = run_forked(measure, entry, timeout)
        record = dict(model_type=entry.model_type, architecture=entry.architecture) | record
        record["seconds"] = round(time.perf_counter() - t, 2)
        if "error" not in families:
            record["nearest_by_names"] = nearest(record, families)
        by_names = (record.get("nearest_by_names") or {}).get("family")
        record["nearest_by_import"] = closest_import(record, by_names)
        record.pop("tensors", None)
        records.append(record)
        print(f"[{i}/{len(chosen)}] {entry.architecture}: {_summary(record)}", flush=True)
    return dict(
        transformers=transformers.__version__,
        torch=torch.__version__,
        command=" ".join(["python scripts/coverage.py", *sys.argv[1:]]),
        wall_seconds=round(time.perf_counter() - start, 1),
        cpus=os.cpu_count(),
        load_average=round(os.getloadavg()[0], 1),  # at the end: other jobs on the machine
        counts=counts(records),
        architectures=records,
    )


def _summary(record: dict[str, Any]) -> str:
    if "error" in record:
        return f"stopped: {record['error']}"
    if not record.get("builds_tiny"):
        return f"no tiny build ({record['why_not'][:100]})"
    if record["status"] in ("exact", "wrong"):
        return f"{record['status']} (float32 Δ {record['delta_float32']:.1e})"
    return f"{record['status']} ({record['message'][:100]})"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--only", nargs="+", default=[], metavar="NAME",
                        help="classes or model types to measure")  # fmt: skip
    parser.add_argument("--sample", type=int, default=0, metavar="N")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per entry")
    parser.add_argument("--out", type=Path, help=f"the JSON (default for a full run: {JSON})")
    parser.add_argument("--docs", type=Path, help=f"the page (default for a full run: {DOCS})")
    args = parser.parse_args(argv)
    full = not args.only and not args.sample
    result = sweep(entries(args.only, args.sample, args.seed), args.timeout)
    out, docs = args.out or (JSON if full else None), args.docs or (DOCS if full else None)
    if out:
        out.write_text(json.dumps(result, indent=1) + "\n")
    if docs:
        docs.write_text(_coverage_page.page(result))
    print(json.dumps(result["counts"]), f"in {result['wall_seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
