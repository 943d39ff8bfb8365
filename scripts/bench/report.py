"""Reporting for `scripts/bench`: the machine, cache sizes, resident memory, Markdown."""

import os
import platform
import subprocess
from pathlib import Path

import torch


def machine_info(root: Path) -> dict:
    """The machine, the versions, the threads, the commit of `root` and the load at the start."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        from importlib.metadata import version

        tl_version = version("transformer_lens")
    except Exception:
        tl_version = None
    commit = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return {
        "cpu": cpu,
        "logical_cores": os.cpu_count(),
        "cores_available": len(os.sched_getaffinity(0))
        if hasattr(os, "sched_getaffinity")
        else None,
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "transformer_lens": tl_version,
        "git_commit": commit or None,
        "load_average_start": list(os.getloadavg()),
    }


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    r = row["ratio"]
    return f"x{r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f}), {row['median_s'] * 1e3:.1f} ms"


_MALLOC = {
    "steady": "with fixed thresholds (`STEADY_MALLOC` in `scripts/bench/timing.py`), so that "
    "page faults do not vary from one process to the next.",
    "default": "with its default adaptive thresholds.",
}


def _same_math_table(results: list[dict]) -> list[str]:
    """Every forward row against the same-math reference of its group."""
    rows = [r for r in results if "ratio_same_math" in r and r["contender"] != "bare"]
    if not rows:
        return []
    lines = [
        "",
        "## Hooks against a hook-free forward of the same math",
        "",
        "Median ratio (min-max) to the same-math reference timed in the same rounds.",
        "",
        "| setting | measure | contender | vs same math | vs bare |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        same, bare = r["ratio_same_math"], r["ratio"]
        lines.append(
            f"| {r['setting']} | {r['measure']} | {r['contender']} | x{same['median']:.2f} "
            f"({same['min']:.2f}-{same['max']:.2f}) | x{bare['median']:.2f} |"
        )
    return lines


def markdown(report: dict) -> str:
    """The report as Markdown: header, targets, the same-math table, each section, memory."""
    lines = _header(report) + _targets(report)
    lines += _same_math_table(report["results"])
    lines += _sections(report)
    lines += _memory(report)
    settings = report["settings"]["described"]
    lines += ["", "## settings", ""] + [f"- {k}: {v}" for k, v in settings.items()]
    if report["skipped"]:
        lines += ["", "## not measured", ""]
        lines += [f"- {s['section']}: {s['measure']}: {s['reason']}" for s in report["skipped"]]
    return "\n".join(lines) + "\n"


def _header(report: dict) -> list[str]:
    m = report["machine"]
    return [
        "# Benchmark: hookedattn against a bare plain-torch model",
        "",
        f"Machine: {m['cpu']}, {m['cores_available']} cores available, torch {m['torch']} "
        f"({m['torch_threads']} threads), Python {m['python']}, transformer_lens "
        f"{m['transformer_lens'] or 'not installed'}; commit {m['git_commit']}. Load average "
        f"{m['load_average_start'][0]:.1f} at the start, "
        f"{m['load_average_end'][0]:.1f} at the end.",
        "",
        "Each group of rows is timed together, interleaved; its first row is the reference "
        "(the bare plain-torch model, or for patching the one-forward-per-patch loop). Each "
        "cell: median over rounds of (time / time of the reference in the same round), "
        "min-max in brackets, then the median time per call. "
        f"{report['settings']['rounds']} rounds, {report['settings']['clock']} clock "
        "(cpu: this process's CPU time, which leaves out waiting for a core on a shared "
        "machine); all runs under `torch.no_grad()`; glibc malloc "
        + _MALLOC[report["settings"].get("malloc", "default")]
        + " Two references: **bare** (SDPA, fused LayerNorm and qkv: the physical limit) "
        "and **same math** (hookedattn's written-out explicit-softmax attention and unfused "
        "LayerNorm without hook points: what it computes where hooks read the scores and "
        "norms; with every hook idle hookedattn runs fused kernels instead), against which "
        "the hooks' own cost is read."
        + (
            " **Quick run: tiny settings, not a measurement.**"
            if report["settings"]["quick"]
            else ""
        ),
        "",
        "## Targets (median ratio against the reference)",
        "",
        "| setting | measure | reference | target | measured | met | source |",
        "|---|---|---|---|---|---|---|",
    ]


def _targets(report: dict) -> list[str]:
    lines = []
    for t in report["targets"]:
        measured = "not measured" if t["measured"] is None else f"{t['measured']:.2f}"
        met = {None: "-", True: "yes", False: "**no**"}[t["met"]]
        lines.append(
            f"| {t['setting']} | {t['measure']} | {t.get('reference', 'bare')} | "
            f"<= {t['target']} | {measured} | {met} | {t['source']} |"
        )
    return lines


def _sections(report: dict) -> list[str]:
    lines = []
    for section in dict.fromkeys(r["section"] for r in report["results"]):
        rows = [r for r in report["results"] if r["section"] == section]
        columns = list(dict.fromkeys(r["contender"] for r in rows if not r["reference"]))
        lines += ["", f"## {section}", ""]
        lines.append("| setting | measure | reference | " + " | ".join(columns) + " |")
        lines.append("|---|---|---|" + "---|" * len(columns))
        for group in dict.fromkeys(r["group"] for r in rows):
            here = [r for r in rows if r["group"] == group]
            ref = here[0]
            blank = " |" * len(columns)
            lines.append(
                f"| {ref['setting']} | {ref['measure']} ({ref['contender']}) | "
                f"{ref['median_s'] * 1e3:.1f} ms ({ref['min_s'] * 1e3:.1f}-"
                f"{ref['max_s'] * 1e3:.1f}) |{blank}"
            )
            for measure in dict.fromkeys(r["measure"] for r in here[1:]):
                cells = [
                    _cell(
                        next(
                            (r for r in here[1:] if (r["measure"], r["contender"]) == (measure, c)),
                            None,
                        )
                    )
                    for c in columns
                ]
                lines.append(f"| {ref['setting']} | {measure} | | " + " | ".join(cells) + " |")
    return lines


def _memory(report: dict) -> list[str]:
    lines = []
    if report["memory"]:
        lines += [
            "",
            "## memory (each mode run in fresh processes; peak resident memory above the "
            "resident memory before the run: the median over processes, min-max in brackets)",
            "",
            "| setting | mode | peak extra (MB) | cache: names | summed over names (MB) | "
            "distinct storages (MB) |",
            "|---|---|---|---|---|---|",
        ]
        for r in report["memory"]:
            c = r.get("cache")
            cache = (
                f"{c['names']} | {c['bytes_summed_over_names'] / 2**20:.1f} | "
                f"{c['bytes_distinct_storages'] / 2**20:.1f} ({c['distinct_storages']})"
                if c
                else "- | - | -"
            )
            low, high = r.get("peak_extra_bytes_range", [r["peak_extra_bytes"]] * 2)
            spread = f" ({low / 2**20:.1f}-{high / 2**20:.1f})" if low != high else ""
            peak = f"{r['peak_extra_bytes'] / 2**20:.1f}{spread}"
            lines.append(f"| {r['setting']} | {r['mode']} | {peak} | {cache} |")
    return lines
