"""scripts/worklog.py reproduces every table of the seed worklog to its 4 printed decimals."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("worklog") / "worklog.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "worklog.py"), "--json", str(out)],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    return proc.stdout, json.loads(out.read_text())


SEED = json.loads((ROOT / "scripts" / "data" / "seed_worklog_tables.json").read_text())
TABLES = [name for name in SEED if not name.startswith("_")]


@pytest.mark.parametrize("name", TABLES)
def test_table_matches_the_worklog_to_four_decimals(run, name):
    _, result = run
    ours, theirs = result["tables"][name], SEED[name]
    for row_ours, row_theirs in zip(ours, theirs, strict=True):
        for a, b in zip(row_ours, row_theirs, strict=True):
            if b == "-inf":
                assert a == -math.inf
            else:
                assert abs(a - b) <= 0.5e-4 + 1e-6, (name, a, b)


def test_printed_attention_of_sat(run):
    stdout, result = run
    assert [round(v, 4) for v in result["sat_attention"]] == [0.6029, 0.1453, 0.2518]
    assert '"sat" reads 0.6029 of its update from "The"' in stdout


def test_parallel_equals_one_token_at_a_time(run):
    _, result = run
    assert result["parallel_vs_sequential_max_abs_diff"] < 1e-5


def test_output_projection_identities(run):
    _, result = run
    projection = result["output_projection"]
    assert projection["concat_vs_sum_of_heads"] < 1e-5
    assert projection["sum_of_head_results_vs_attn_out"] < 1e-5
    assert projection["w_ov_vs_head_results"] < 1e-5
    assert projection["rank_w_ov"] == 8
