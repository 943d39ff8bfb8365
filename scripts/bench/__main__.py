"""Side-by-side speed and memory benchmark: hookedattn against a bare plain-torch model.

Every measure is a ratio against a bare reference written here with the same weights (one
fused qkv matmul, `scaled_dot_product_attention`, no hooks, no checks): the "physical
limit" on this machine. The forward groups also time a second reference, hookedattn's own
math written out without hook points (`same_math.py`: the explicit softmax over masked
scores, the unfused LayerNorm: what hookedattn computes where a hook reads the scores), so
that the cost of the hooks is told apart from the cost of the attention algorithm that they
need. Contenders
run interleaved in the same rounds (A B C, then C B A, ...), so a slow spell on a shared
machine hits them all; each round gives one ratio per contender, and we report the median
and min-max of those ratios and of the times (`timing.py`). Before timing, each
contender's output is checked against the reference's.

When `transformer_lens` is installed (the optional `bench` extra) its numbers are another
column on the same weights: TransformerLens 3's `HookedTransformer` ("transformer_lens"),
or under TransformerLens 4, which has none, its `TransformerBridge` around the HuggingFace
GPT-2 with our weights, in compatibility mode and as booted (`tl4.py`: the
"transformer_lens 4 bridge" and "transformer_lens 4 native" columns). The two cannot share
an interpreter; run the bench under each to get both. The `moe` section times an imported
mixture of experts against transformers' own forward on the same weights (`moe.py`).
Sections that need parts of hookedattn not present yet are skipped with a note; nothing is
ever estimated.

    python scripts/bench            # full run, writes docs/benchmarks/latest.{json,md}
    python scripts/bench --quick    # tiny settings, a smoke run of every section

This folder's other modules are the report's parts, imported by their plain names (running
the folder puts it first on `sys.path`). Five also run on their own: `distributed.py` (a
section here too), and the benches of the activation store, SAE training, transcoders and
attribution graphs' memory against the prompt's length (`store.py`, `sae.py`,
`transcoders.py`, `graph_memory.py`), e.g. `python scripts/bench/store.py --quick`.

Only torch and the standard library are used beyond hookedattn itself; the reference
reshapes with plain torch on purpose (it is how one writes the fastest version by hand).
"""

import argparse
import dataclasses
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import analyses  # noqa: E402
from distributed import distributed_section  # noqa: E402
from generation import generation_section  # noqa: E402
from hf import hf_forward, hf_gpt2  # noqa: E402
from memory import LIVE, memory_probe, memory_section  # noqa: E402
from moe import moe_section  # noqa: E402
from reference import BareTransformer, build, transformer_lens_model  # noqa: E402
from report import machine_info, markdown  # noqa: E402
from same_math import SameMathTransformer  # noqa: E402
from settings import (  # noqa: E402
    BARE_REF,
    FULL,
    QUICK,
    SAME_MATH,
    SAME_MATH_MEASURE,
    TARGETS,
    Setting,
)
from timing import CLOCKS, Contender, interleave, steady_malloc  # noqa: E402
from tl4 import bridge_models, transformer_lens_major  # noqa: E402

from hookedattn import HookedTransformer  # noqa: E402

SCHEMA_VERSION = 1
BARE, OURS, TL, HF = "bare", "hookedattn", "transformer_lens", "transformers"
TL_MAJOR = transformer_lens_major()  # 3: HookedTransformer; 4: TransformerBridge only

# ----------------------------------------------------------------------------- contenders


RESID = ("hook_resid_pre", "hook_resid_mid", "hook_resid_post")


def _is_resid(name: str) -> bool:
    return name.endswith(RESID)


def _noop(x: Tensor, hook: Any) -> None:
    return None


def forward_measures(model: Any, tokens: Tensor, one_name: str) -> dict[str, Callable]:
    """The forward-pass measures, written once for both toolkits (their APIs match)."""
    every = [(lambda name: True, _noop)]
    return {
        "forward, no hooks attached": lambda: model(tokens),
        "run_with_cache, everything": lambda: model.run_with_cache(tokens),
        "run_with_cache, residual stream only": lambda: model.run_with_cache(
            tokens, names_filter=_is_resid
        ),
        f"run_with_cache, one name ({one_name})": lambda: model.run_with_cache(
            tokens, names_filter=one_name
        ),
        "no-op hook on every hook point": lambda: model.run_with_hooks(tokens, fwd_hooks=every),
        f"one hook on {one_name}": lambda: model.run_with_hooks(
            tokens, fwd_hooks=[(one_name, _noop)]
        ),
    }


def _check_hook_names(contender: str, model: Any, tokens: Tensor, one_name: str) -> None:
    """The names the measures hook exist in `model`: a cache or hook on a missing name
    would time a forward that records nothing."""
    _, cache = model.run_with_cache(tokens, names_filter=_is_resid)
    ends = ("hook_resid_pre", "hook_resid_post")  # an attention-only block has no resid_mid
    expected = {f"blocks.{i}.{n}" for i in range(model.cfg.n_layers) for n in ends}
    fired = []
    model.run_with_hooks(tokens, fwd_hooks=[(one_name, lambda x, hook: fired.append(1))])
    if not expected <= set(cache.keys()) or not fired:
        raise AssertionError(f"{contender}: the residual-stream hook points are not all there")


def _synchronized(fn: Callable) -> Callable:
    def run() -> Any:
        out = fn()
        torch.cuda.synchronize()
        return out

    return run


def _logits(out: Any) -> Tensor:
    return out[0] if isinstance(out, tuple) else out


def _agrees(out: Any, ref: Tensor) -> bool:
    tol = 1e-4 if ref.dtype in (torch.float32, torch.float64) else 0.1  # bfloat16, float16
    return torch.allclose(_logits(out).float(), ref.float(), rtol=tol, atol=tol)


# ----------------------------------------------------------------------------- sections


class Run:
    """Options, and the rows, notes and memory records of one benchmark run."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.quick = args.quick
        self.device = args.device
        # On an accelerator every setting runs on it, in the dtype asked for.
        on = {"device": args.device, "dtype": args.dtype}
        self.settings = {
            k: dataclasses.replace(s, cfg=s.cfg | on)
            for k, s in (QUICK if args.quick else FULL).items()
        }
        self.rounds = args.rounds or (3 if args.quick else 9)
        self.min_sample_s = 0.002 if args.quick else 0.05
        self.clock = CLOCKS[args.clock]
        self.use_tl = not args.no_transformer_lens
        # Each memory probe's process fixes glibc's thresholds as this one does.
        self.steady_malloc = args.malloc == "steady"
        self.generation_groups = set(args.generation_groups.split(","))
        self.rows: list[dict] = []
        self.skipped: list[dict] = []
        self.memory: list[dict] = []
        self.extra: dict[str, Any] = {}

    def skip(self, section: str, measure: str, reason: str) -> None:
        """Record (and print) a measure not taken, with why."""
        print(f"  skipped: {measure}: {reason}")
        self.skipped.append({"section": section, "measure": measure, "reason": reason})

    def time_group(
        self,
        section: str,
        setting: str,
        group: dict[tuple[str, str], Callable],
        rounds: int | None = None,
    ) -> None:
        """Time `{(measure, contender): fn}` in one interleaved group; the first is the ref.

        A group holding the same-math reference also gets every row's ratio to it.
        """
        if self.device.startswith("cuda"):  # kernels run asynchronously: time to completion
            group = {k: _synchronized(fn) for k, fn in group.items()}
        contenders = [Contender(f"{c}|{m}", fn) for (m, c), fn in group.items()]
        second = f"{BARE}|{SAME_MATH_MEASURE}" if (SAME_MATH_MEASURE, BARE) in group else None
        rounds = rounds or self.rounds
        results = interleave(contenders, rounds, self.min_sample_s, self.clock, second)
        group_id = len({r["group"] for r in self.rows})
        for (measure, contender), c in zip(group, contenders, strict=True):
            row = {"section": section, "setting": setting, "measure": measure, "group": group_id}
            row |= {"contender": contender, "reference": c is contenders[0]}
            self.rows.append(row | results[c.name])
            ratio, same = results[c.name]["ratio"], results[c.name].get("ratio_same_math")
            print(
                f"  {contender:>16}  {measure:<48} {results[c.name]['median_s'] * 1e3:9.2f} ms"
                f"  x{ratio['median']:.3f} ({ratio['min']:.3f}-{ratio['max']:.3f})"
                + (f"  same math x{same['median']:.3f}" if same else "")
            )

    def tl_models(self, model: HookedTransformer, ref: Tensor, tokens: Tensor) -> dict[str, Any]:
        """`{column: model}`: TransformerLens on `model`'s weights, where its logits agree
        with the bare model's (TransformerLens 3's one model, or TransformerLens 4's bridges)."""
        if not self.use_tl or TL_MAJOR is None:
            return {}
        models = bridge_models(model) if TL_MAJOR >= 4 else {TL: transformer_lens_model(model)}
        agreeing = {}
        with torch.no_grad():
            for column, tl in models.items():
                if _agrees(tl(tokens), ref):
                    agreeing[column] = tl
                else:
                    print(f"  {column} disagrees with the bare model on these weights; left out")
        return agreeing

    def tl_model(self, model: HookedTransformer, ref: Tensor, tokens: Tensor) -> Any:
        """TransformerLens 3's model for the analysis section, or None: its analyses call
        `HookedTransformer`'s own API, so they get no TransformerLens 4 column."""
        if TL_MAJOR != 3:
            return None
        return self.tl_models(model, ref, tokens).get(TL)


def forward_section(run: Run, key: str, shipped: tuple | None = None) -> None:
    """The forward measures of setting `key` (or of the shipped model), in one group led by
    the bare reference, each contender's logits checked against it first."""
    model, setting = shipped if shipped else (None, run.settings[key])
    print(f"forward [{key}] {setting.description}")
    if model is None:
        model, tokens = build(setting.cfg, setting.batch, setting.pos)
    else:
        generator = torch.Generator().manual_seed(1)
        tokens = torch.randint(
            0, model.cfg.d_vocab, (setting.batch, setting.pos), generator=generator
        ).to(model.cfg.device)
    bare, same = BareTransformer(model), SameMathTransformer(model)
    one_name = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"
    with torch.no_grad():
        ref = bare(tokens)
        # The written-out algorithm our forward runs where a hook reads the scores; with
        # every hook point idle our forward runs fused kernels, equal to float rounding.
        if not _agrees(same(tokens), model(tokens)):
            raise AssertionError("the same-math reference differs from hookedattn's forward")
        group = {
            ("plain forward (bare reference)", BARE): lambda: bare(tokens),
            (SAME_MATH_MEASURE, BARE): lambda: same(tokens),
        }
        toolkits = {OURS: model} | run.tl_models(model, ref, tokens)
        for contender, m in toolkits.items():
            _check_hook_names(contender, m, tokens, one_name)
            for measure, fn in forward_measures(m, tokens, one_name).items():
                if not _agrees(fn(), ref):
                    raise AssertionError(
                        f"{contender} {measure}: logits differ from the bare model"
                    )
                group[(measure, contender)] = fn
        hf = hf_gpt2(model)
        if hf is not None and _agrees(hf_forward(hf, tokens)(), ref):
            group[("forward, no hooks attached", HF)] = hf_forward(hf, tokens)
        run.time_group("forward", key, group)


def compile_section(run: Run, key: str) -> None:
    """`torch.compile` of the forward and of a fixed-names cache against eager, setting `key`;
    the first calls' compile times go in `extra`."""
    setting = run.settings[key]
    print(f"torch.compile [{key}] {setting.description}")
    model, tokens = build(setting.cfg, setting.batch, setting.pos)
    bare = BareTransformer(model)
    names = [f"blocks.{i}.attn.hook_pattern" for i in range(model.cfg.n_layers)]
    names += [f"blocks.{i}.hook_resid_post" for i in range(model.cfg.n_layers)]
    compiled_forward = torch.compile(model)
    compiled_cache = torch.compile(lambda t: model.run_with_cache(t, names_filter=names))
    with torch.no_grad():
        ref = bare(tokens)
        seconds = {}
        for label, fn in (("forward", compiled_forward), ("run_with_cache", compiled_cache)):
            start = time.perf_counter()
            out = fn(tokens)
            seconds[label] = time.perf_counter() - start
            if not _agrees(out, ref):
                raise AssertionError(f"compiled {label} differs from the bare model")
        print(f"  compile time (first call): {seconds}")
        run.extra["compile_seconds"] = {key: seconds}
        run.time_group(
            "compile",
            key,
            {
                ("plain forward (bare reference)", BARE): lambda: bare(tokens),
                ("forward, no hooks (eager)", OURS): lambda: model(tokens),
                ("forward, no hooks (compiled)", OURS): lambda: compiled_forward(tokens),
                ("run_with_cache, fixed names (eager)", OURS): lambda: model.run_with_cache(
                    tokens, names_filter=names
                ),
                ("run_with_cache, fixed names (compiled)", OURS): lambda: compiled_cache(tokens),
            },
        )


def shipped_model(run: Run) -> tuple[HookedTransformer, Setting] | None:
    """The shipped 2-layer attention-only model, or None (with a note) before it exists."""
    try:
        from hookedattn.core._pretrained import list_pretrained
    except ImportError:
        run.skip("forward", "setting c", "hookedattn.core._pretrained missing")
        return None
    infos = [i for i in list_pretrained() if i.config.n_layers == 2 and i.config.attn_only]
    if not infos:
        names = [i.name for i in list_pretrained()]
        run.skip("forward", "setting c", f"no 2-layer attention-only model shipped yet ({names})")
        return None
    model = HookedTransformer.from_pretrained(infos[0].name).to(run.device)
    model.eval()
    batch, pos = (2, 8) if run.quick else (8, min(128, model.cfg.n_ctx))
    cfg = dataclasses.asdict(model.cfg)
    return model, Setting("c", cfg, batch, pos, f"shipped {infos[0].name}")


# ----------------------------------------------------------------------------- report


def _target_rows(run: Run) -> list[dict]:
    out = []
    for section, setting, measure, target, source, reference in TARGETS:
        found = [
            r
            for r in run.rows
            if (r["section"], r["setting"], r["measure"], r["contender"])
            == (section, setting, measure, OURS)
        ]
        key = "ratio_same_math" if reference == SAME_MATH else "ratio"
        measured = found[0][key]["median"] if found and key in found[0] else None
        if section == "memory":
            measured = _peak_ratio(run, setting, measure, reference)
        met = None if measured is None else measured <= target
        out.append(
            {
                "section": section,
                "setting": setting,
                "measure": measure,
                "target": target,
                "source": source,
                "reference": reference,
                "measured": measured,
                "met": met,
            }
        )
    return out


def _peak_ratio(run: Run, setting: str, mode: str, reference: str) -> float | None:
    """Peak extra resident memory of `mode` over the reference's in one setting: the bare
    forward's, or with a TransformerLens column as reference ("transformer_lens", or a
    TransformerLens 4 bridge) that column's full cache; a mode ending in `LIVE` compares
    the peaks of live tensor bytes instead."""
    field = "peak_extra_bytes"
    if mode.endswith(LIVE):
        mode, field = mode.removesuffix(LIVE), "peak_live_bytes"
    peaks = {m["mode"]: m.get(field) for m in run.memory if m["setting"] == setting}
    if reference == BARE_REF:
        over = peaks.get("plain forward (bare reference)")
    else:  # a TransformerLens column's full cache
        over = peaks.get(f"{reference} run_with_cache, everything")
    return None if not over or peaks.get(mode) is None else peaks[mode] / over


# ----------------------------------------------------------------------------- main

SECTIONS = ("forward", "compile", "generation", "memory", "analysis", "moe", "distributed")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny settings, few rounds")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "docs" / "benchmarks")
    parser.add_argument("--sections", default=",".join(SECTIONS), help="comma-separated")
    parser.add_argument("--settings", default=None, help="forward settings, e.g. a,b,s64,s512")
    parser.add_argument("--generation-settings", default="a,b", help="generation settings")
    parser.add_argument(
        "--generation-groups", default="kv,uncached,cache", help="of kv, uncached, cache"
    )
    parser.add_argument("--no-transformer-lens", action="store_true")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch threads (default: torch's own); 1 gives stable ratios on a busy machine",
    )
    parser.add_argument(
        "--malloc",
        choices=("steady", "default"),
        default="steady",
        help="steady: fixed glibc malloc thresholds, so page faults do not vary by process",
    )
    parser.add_argument("--device", default="cpu", help="cpu, or cuda to run on a GPU")
    parser.add_argument(
        "--dtype", default="float32", choices=("float32", "bfloat16", "float16", "float64")
    )
    parser.add_argument("--memory-probe", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--report-from",
        type=Path,
        default=None,
        help="recompute the targets and Markdown of an earlier run's JSON; times nothing",
    )
    return parser


def _run_sections(run: Run, args: argparse.Namespace, sections: list[str]) -> tuple | None:
    """Every asked-for section, in order; the shipped model they used (if any)."""
    shipped = shipped_model(run) if {"forward", "analysis"} & set(sections) else None
    if "forward" in sections:
        for key in (args.settings or "s64,s512,a,b").split(","):
            forward_section(run, key)
        if shipped is not None:
            forward_section(run, "c", shipped)
    if "compile" in sections:
        if args.no_compile or run.quick:
            run.skip("compile", "torch.compile", "not in --quick runs (compiling takes minutes)")
        else:
            compile_section(run, "a")
    if "generation" in sections:
        for key in args.generation_settings.split(","):
            generation_section(run, key)
    if "memory" in sections:
        for key in ("a", "long") if run.quick else ("a", "b", "long"):
            memory_section(run, key, run.settings[key])
    if "analysis" in sections:
        analyses.analysis_section(run, shipped)
    if "moe" in sections:
        moe_section(run, _agrees, HF, OURS)
    if "distributed" in sections:  # 2 tensor-parallel ranks (torchrun) against one process
        distributed_section(run)
    return shipped


def _report(run: Run, args: argparse.Namespace, machine: dict, malloc: str, shipped) -> dict:
    """The JSON report: machine, settings, targets and every measured row."""
    return {
        "schema": SCHEMA_VERSION,
        "machine": machine,
        "settings": {
            "quick": run.quick,
            "rounds": run.rounds,
            "min_sample_s": run.min_sample_s,
            "clock": args.clock,
            "malloc": malloc,
            "grad": "torch.no_grad()",
            "described": {k: s.description for k, s in run.settings.items()}
            | ({"c": shipped[1].description} if shipped else {})
            | ({"moe": run.extra["moe_setting"]} if "moe_setting" in run.extra else {}),
        },
        "targets": _target_rows(run),
        "results": run.rows,
        "memory": run.memory,
        "skipped": run.skipped,
        "extra": run.extra,
    }


def _rerendered(path: Path) -> int:
    """Recompute an earlier run's targets (after `TARGETS` changed) from its JSON, and
    write the JSON and its Markdown next to it again; nothing is timed."""
    report = json.loads(path.read_text())
    run = argparse.Namespace(rows=report["results"], memory=report["memory"])
    report["targets"] = _target_rows(run)
    path.write_text(json.dumps(report, indent=1) + "\n")
    path.with_suffix(".md").write_text(markdown(report))
    print(f"wrote {path} and {path.with_suffix('.md')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and write `latest.json` and `latest.md` into `--out-dir`."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.memory_probe is not None:
        print(json.dumps(memory_probe(json.loads(args.memory_probe))))
        return 0
    if args.report_from is not None:
        return _rerendered(args.report_from)
    logging.disable(logging.WARNING)  # TransformerLens warns once per cached head result
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    malloc = "steady" if args.malloc == "steady" and steady_malloc() else "default"
    run = Run(args)
    sections = args.sections.split(",")
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; valid: {', '.join(SECTIONS)}")
    machine = machine_info(ROOT)
    print(json.dumps(machine))
    if machine["load_average_start"][0] > (machine["cores_available"] or 1):
        print("warning: the machine is busy; ratios are noisy (try --threads 1)")
    shipped = _run_sections(run, args, sections)
    machine["load_average_end"] = list(os.getloadavg())
    report = _report(run, args, machine, malloc, shipped)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "latest.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out_dir / "latest.md").write_text(markdown(report))
    print(f"wrote {args.out_dir / 'latest.json'} and {args.out_dir / 'latest.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
