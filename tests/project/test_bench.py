"""`python scripts/bench --quick` runs every section on tiny settings and writes its JSON schema.

A smoke test of the benchmark script in a subprocess (nothing imports `scripts/`); it
checks the report's structure, never a timing.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

# End to end (subprocesses, torchrun, real TransformerLens): run in CI with `-m slow`.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
# transformer_lens 4 has only the bridge: two columns (`scripts/bench/tl4.py`)
TL4 = ("transformer_lens 4 bridge", "transformer_lens 4 native")
CONTENDERS = ("bare", "hookedattn", "transformer_lens", "transformers", *TL4)


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("bench")
    command = [sys.executable, str(ROOT / "scripts" / "bench"), "--quick", "--rounds", "2"]
    command += ["--threads", "1", "--no-transformer-lens", "--out-dir", str(out)]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "latest.json").read_text()), (out / "latest.md").read_text()


def test_the_report_names_the_machine_and_the_run(report):
    data, _ = report
    assert data["schema"] == 1
    machine = data["machine"]
    for key in ("cpu", "logical_cores", "torch", "python", "git_commit", "load_average_end"):
        assert key in machine
    assert machine["torch_threads"] == 1
    assert machine["transformer_lens"] is None or isinstance(machine["transformer_lens"], str)
    assert data["settings"]["quick"] is True
    assert data["settings"]["rounds"] == 2


def test_every_section_reports_groups_led_by_their_reference(report):
    data, _ = report
    rows = data["results"]
    assert {r["section"] for r in rows} >= {"forward", "generation", "analysis"}
    for group in {r["group"] for r in rows}:
        members = [r for r in rows if r["group"] == group]
        assert [r["reference"] for r in members] == [True] + [False] * (len(members) - 1)
        assert members[0]["ratio"] == {"median": 1.0, "min": 1.0, "max": 1.0}
    for r in rows:
        assert r["min_s"] <= r["median_s"] <= r["max_s"]
        assert r["ratio"]["min"] <= r["ratio"]["median"] <= r["ratio"]["max"]
        assert r["rounds"] == 2 and r["inner"] >= 1
        assert r["contender"] in CONTENDERS


def test_forward_measures_cover_every_setting(report):
    data, _ = report
    forward = [r for r in data["results"] if r["section"] == "forward"]
    for setting in ("s64", "s512", "a", "b"):
        measures = {r["measure"] for r in forward if r["setting"] == setting}
        assert "plain forward (bare reference)" in measures
        assert "forward, no hooks attached" in measures
        assert "run_with_cache, everything" in measures
        assert "no-op hook on every hook point" in measures
        assert any(m.startswith("run_with_cache, one name") for m in measures)
        assert any(m.startswith("one hook on") for m in measures)


def test_transformers_runs_the_same_weights_in_forward_generation_and_moe(report):
    pytest.importorskip("transformers")
    data, _ = report
    sections = {r["section"] for r in data["results"] if r["contender"] == "transformers"}
    assert sections == {"forward", "generation", "moe"}


def test_long_context_peak_memory_is_a_target(report):
    data, _ = report
    (target,) = [t for t in data["targets"] if t["section"] == "memory" and t["setting"] == "long"]
    assert target["measured"] is not None


def test_forward_groups_also_measure_against_the_same_math_without_hooks(report):
    data, markdown = report
    forward = [r for r in data["results"] if r["section"] == "forward"]
    for group in {r["group"] for r in forward}:
        members = [r for r in forward if r["group"] == group]
        same = [r for r in members if r["measure"].startswith("plain forward, same math")]
        assert len(same) == 1 and same[0]["contender"] == "bare"
        assert same[0]["ratio_same_math"] == {"median": 1.0, "min": 1.0, "max": 1.0}
        assert all("ratio_same_math" in r for r in members)
    assert "## Hooks against a hook-free forward of the same math" in markdown
    # The MoE row is held against transformers (eager), TL's cache methods and the full
    # cache's memory against TransformerLens (3.5.1 or 4's bridges), the others against
    # the bare model.
    references = {"bare", "same math", "transformers eager", "transformer_lens", *TL4}
    assert {t["reference"] for t in data["targets"]} == references
    assert data["settings"]["malloc"] in ("steady", "default")


def test_memory_records_the_cache_bytes_once_per_storage(report):
    data, _ = report
    modes = {m["mode"]: m for m in data["memory"]}
    cached = modes["hookedattn run_with_cache, everything"]["cache"]
    assert cached["bytes_distinct_storages"] <= cached["bytes_summed_over_names"]
    assert cached["distinct_storages"] <= cached["names"]
    assert all(m["peak_extra_bytes"] >= 0 for m in data["memory"])


def test_targets_and_skipped_measures_are_listed_with_reasons(report):
    data, markdown = report
    assert len(data["targets"]) >= 9
    for target in data["targets"]:
        assert target["met"] in (True, False, None)
        assert (target["measured"] is None) == (target["met"] is None)
    for skipped in data["skipped"]:
        assert skipped["reason"]
    assert "| setting | measure | reference |" in markdown
    assert data["machine"]["cpu"] in markdown


def test_memory_targets_read_each_transformer_lens_columns_full_cache(report, tmp_path):
    # The same-names target against a TransformerLens 4 bridge divides by that column's
    # full cache (recomputed from a report by --report-from, which times nothing).
    data, _ = report
    data = json.loads(json.dumps(data))
    ours = "hookedattn run_with_cache, TransformerLens's names"
    data["memory"] = [m for m in data["memory"] if m["setting"] != "a"] + [
        {"setting": "a", "mode": ours, "peak_extra_bytes": 30, "peak_live_bytes": 9},
        {"setting": "a", "mode": f"{TL4[0]} run_with_cache, everything", "peak_extra_bytes": 40,
         "peak_live_bytes": 12},
    ]  # fmt: skip
    path = tmp_path / "latest.json"
    path.write_text(json.dumps(data))
    command = [sys.executable, str(ROOT / "scripts" / "bench"), "--report-from", str(path)]
    subprocess.run(command, cwd=ROOT, check=True, capture_output=True, timeout=300)
    targets = json.loads(path.read_text())["targets"]
    measured = {
        (t["measure"], t["reference"]): t["measured"]
        for t in targets
        if t["section"] == "memory" and t["setting"] == "a"
    }
    assert measured[ours, TL4[0]] == 30 / 40
    assert measured[ours + " (live tensors)", TL4[0]] == 9 / 12
    assert measured[ours, TL4[1]] is None  # that column did not run
    assert measured[ours, "transformer_lens"] is None
