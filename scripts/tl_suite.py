"""Run TransformerLens 3.5.1's own tests, unedited, against hookedattn_tl (or real TL).

    python scripts/tl_suite.py --against facade          # transformer_lens -> hookedattn_tl
    python scripts/tl_suite.py --against real --python ~/.cache/hookedattn/tl-3.5.1/bin/python
    python scripts/tl_suite.py --compare real.json facade.json

The tests come from TransformerLens 3.5.1's source distribution on PyPI (`pip download
transformer_lens==3.5.1 --no-binary :all: --no-deps`, which ships the tag's `tests/`
folder), unpacked once under `~/.cache/hookedattn/`; `--tests DIR` uses a `tests/` folder
you have instead. They are copied to a scratch folder and run there as they are, offline
(`HF_HUB_OFFLINE=1`), with TL's own pytest options except its doctest/notebook plugins:
`--jaxtyping-packages` names the package under test (so TL's beartype-based checks apply
to whichever package answers to `transformer_lens`).

`--against facade` binds `transformer_lens` to `hookedattn_tl` by the alias line only
(`hookedattn_tl.install()`, from a pytest plugin that runs after jaxtyping's import hook),
with this repository first on the path. `--against real` runs the same files with the real
package in a separate environment. Each run writes a JSON file of test id -> outcome;
`--compare` prints how many of the tests real TL passes also pass on the facade, and the
ones that do not.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VERSION = "3.5.1"
CACHE = Path.home() / ".cache" / "hookedattn" / f"transformer_lens-{VERSION}-src"

# The files whose subject is the HookedTransformer surface hookedattn_tl mirrors. Left out:
# TransformerBridge (the model_bridge folders, TL 3's wrapper around HF modules), the
# encoder, BERT, HuBERT, T5 and multimodal models, LIT, tracr, the model registry and
# benchmarks, evals, MoE components, per-family pretrained weight conversions, multi-GPU
# and device placement, TL's docs builder, and every test that loads a model from the hub
# (the integration folder, but for the files below that build their models from configs).
SELECTION = (
    "unit/components/test_attention.py",
    "unit/components/test_abstract_attention.py",
    "unit/components/mlps/test_mlp.py",
    "unit/components/mlps/test_gated_mlp.py",
    "unit/components/mlps/test_can_be_used_as_mlp.py",
    "unit/factored_matrix",
    "unit/test_hook_points.py",
    "unit/test_hook_introspection.py",
    "unit/test_hooked_root_module.py",
    "unit/test_hooked_transformer_config.py",
    "unit/test_direct_path_patching.py",
    "unit/test_generate_no_tokenizer.py",
    "unit/test_n_params_total.py",
    "unit/test_patching.py",
    "unit/test_use_attn_result.py",
    "unit/test_split_qkv.py",
    "unit/test_key_value_cache_entry.py",
    "unit/utilities/test_cache.py",
    "integration/test_grouped_query_attention.py",
    "integration/test_start_at_layer.py",
    "integration/test_stop_at_layer.py",
)

PLUGIN = """
import pytest


@pytest.hookimpl(trylast=True)
def pytest_configure(config):
    # After jaxtyping's pytest_configure, so the facade is imported under its import hook.
    import hookedattn_tl

    hookedattn_tl.install()
"""


def tests_folder(given: str | None) -> Path:
    """TL's `tests/` folder: the one given, or the sdist's, downloaded once."""
    if given is not None:
        return Path(given)
    if not (CACHE / "tests").is_dir():
        CACHE.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory() as tmp:
            download = [sys.executable, "-m", "pip", "download", f"transformer_lens=={VERSION}"]
            download += ["--no-binary", ":all:", "--no-deps", "-d", tmp, "-q"]
            subprocess.run(download, check=True)
            (archive,) = Path(tmp).glob("transformer_lens-*.tar.gz")
            with tarfile.open(archive) as tar:
                members = [m for m in tar.getmembers() if "/tests/" in m.name]
                tar.extractall(tmp, members=members, filter="data")
            shutil.copytree(Path(tmp) / f"transformer_lens-{VERSION}" / "tests", CACHE / "tests")
    return CACHE / "tests"


def run(against: str, python: str, tests: Path, out: Path) -> dict[str, str]:
    """Run the selection under `python`; returns test id -> passed/failed/skipped."""
    with tempfile.TemporaryDirectory() as scratch:
        shutil.copytree(tests, Path(scratch) / "tests")
        (Path(scratch) / "tl_alias_plugin.py").write_text(PLUGIN)
        junit = Path(scratch) / "junit.xml"
        package = "hookedattn_tl,hookedattn,analysis" if against == "facade" else "transformer_lens"
        command = [python, "-m", "pytest", *(f"tests/{p}" for p in SELECTION)]
        command += ["-q", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", scratch]
        command += [f"--jaxtyping-packages={package},beartype.beartype"]
        command += ["--continue-on-collection-errors", f"--junitxml={junit}"]
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
        env.setdefault("OMP_NUM_THREADS", "1")
        if against == "facade":
            command += ["-p", "tl_alias_plugin"]
            env["PYTHONPATH"] = os.pathsep.join([str(ROOT), scratch])
        subprocess.run(command, cwd=scratch, env=env, check=False)
        outcomes = outcomes_of(junit)
    out.write_text(json.dumps(outcomes, indent=1, sort_keys=True))
    return outcomes


def outcomes_of(junit: Path) -> dict[str, str]:
    """Test id -> outcome (with the first line of the failure, for failed ones)."""
    outcomes = {}
    for case in ET.parse(junit).iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        problem = case.find("failure") if case.find("failure") is not None else case.find("error")
        if problem is not None:
            outcomes[test_id] = "failed: " + (problem.get("message") or "")[:200].splitlines()[0]
        elif case.find("skipped") is not None:
            outcomes[test_id] = "skipped"
        else:
            outcomes[test_id] = "passed"
    return outcomes


def compare(real_file: Path, facade_file: Path) -> None:
    """Print the facade's score on the tests real TL passes, and what still fails."""
    real, facade = json.loads(real_file.read_text()), json.loads(facade_file.read_text())
    passing = sorted(t for t, o in real.items() if o == "passed")
    failing = [t for t in passing if facade.get(t, "missing") != "passed"]
    print(f"real TL {VERSION}: {len(passing)} passed of {len(real)} collected")
    print(f"hookedattn_tl: {len(passing) - len(failing)} of those {len(passing)} pass")
    for test_id in failing:
        print(f"  {test_id}: {facade.get(test_id, 'not collected')}")


def main() -> None:
    """Command line: run one side, or compare two runs."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", choices=("facade", "real"))
    parser.add_argument("--python", default=sys.executable, help="the interpreter to run in")
    parser.add_argument("--tests", help="a TransformerLens tests/ folder (default: the sdist's)")
    parser.add_argument("--out", help="where to write the outcomes (JSON)")
    parser.add_argument("--compare", nargs=2, metavar=("REAL", "FACADE"))
    args = parser.parse_args()
    if args.compare:
        compare(Path(args.compare[0]), Path(args.compare[1]))
        return
    if args.against is None:
        parser.error("give --against facade|real, or --compare REAL FACADE")
    out = Path(args.out or f"tl_suite_{args.against}.json")
    outcomes = run(args.against, args.python, tests_folder(args.tests), out)
    counts = {k: sum(o.split(":")[0] == k for o in outcomes.values()) for k in ("passed",)}
    counts["failed"] = sum(o.startswith("failed") for o in outcomes.values())
    counts["skipped"] = sum(o == "skipped" for o in outcomes.values())
    print(f"{args.against}: {counts} -> {out}")


if __name__ == "__main__":
    main()
