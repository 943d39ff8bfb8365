"""Fault injection: does the suite catch realistic one-line bugs, and with which test files?

    python scripts/faults.py                    # every fault in scripts/data/faults.toml
    python scripts/faults.py --only rotary-wrong-half gelu-new-exact
    python scripts/faults.py --check            # only: does every fault still apply?
    python scripts/faults.py --workers 2 --json faults.json

Each fault is `(file, original text, replacement)` with the test files expected to catch
it. The tree is copied once per worker to a scratch folder (the files git tracks or would
track; never the working tree itself), the listed test files are run there unchanged (a
baseline: a file that fails without any fault cannot catch one), then for each fault the
replacement is written, the fault's test files run in one pytest process, and the file is
put back. A test file catches the fault when any of its tests fails (or it fails to
collect); the rest of that file is then skipped (`scripts/_fault_catcher.py`). A fault
whose original text is no longer in its file, exactly once, no longer applies: it is
reported, never silently skipped. The exit status is 0 when every fault applies and is
caught by at least two test files (`--min-files`), 1 otherwise.

Only the standard library is imported here (the tests run in subprocesses), so `--check`
is instant and a unit test runs it (tests/project/test_faults.py).
"""

import argparse
import concurrent.futures
import dataclasses
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FAULTS = ROOT / "scripts" / "data" / "faults.toml"


@dataclasses.dataclass(frozen=True)
class Fault:
    """One realistic bug: in `file`, `original` (exactly once) becomes `replacement`."""

    id: str
    what: str
    file: str
    original: str
    replacement: str
    tests: tuple[str, ...]

    def problem(self, root: Path) -> str | None:
        """Why this fault cannot be applied to the tree at `root`; None when it can."""
        path = root / self.file
        if not path.is_file():
            return f"{self.file} does not exist"
        count = path.read_text().count(self.original)
        if count != 1:
            where = "is no longer in" if count == 0 else f"occurs {count} times in"
            return f"its original text {where} {self.file}"
        missing = [t for t in self.tests if not (root / t).is_file()]
        if missing:
            return f"its test files {missing} do not exist"
        return None


def load_faults(path: Path) -> list[Fault]:
    """The faults of a TOML file (`[[fault]]` tables); a `ValueError` names a bad entry."""
    entries = tomllib.loads(path.read_text()).get("fault", [])
    faults, fields = [], {f.name for f in dataclasses.fields(Fault)}
    for i, entry in enumerate(entries):
        if set(entry) != fields:
            raise ValueError(
                f"fault {i} ({entry.get('id')!r}) has fields {sorted(entry)}, "
                f"expected {sorted(fields)}"
            )
        if entry["original"] == entry["replacement"]:
            raise ValueError(f"fault {entry['id']!r}: the replacement is the original")
        faults.append(Fault(**{**entry, "tests": tuple(entry["tests"])}))
    ids = [f.id for f in faults]
    if len(set(ids)) != len(ids):
        raise ValueError(f"fault ids repeat: {sorted({i for i in ids if ids.count(i) > 1})}")
    return faults


# ------------------------------------------------------------------ the scratch copy
def scratch_copy(root: Path, into: Path) -> Path:
    """The files of `root` that git tracks or would track (not ignored), copied to `into`."""
    listed = (
        subprocess.run(
            [
                "git",
                "-C",
                str(root),
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
            ],
            check=True,
            capture_output=True,
        )
        .stdout.decode()
        .split("\0")
    )
    for name in filter(None, listed):
        source = root / name
        if source.is_file():
            target = into / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    return into


@dataclasses.dataclass(frozen=True)
class Run:
    """One pytest process: the files that failed (with their first failure), how long, and
    the end of its output when it did not finish its session (a crash, a timeout)."""

    failed: dict[str, str]
    seconds: float
    unfinished: str | None = None


PLUGIN = Path(__file__).with_name("_fault_catcher.py")


def run_tests(scratch: Path, plugins: Path, files: list[str], timeout: float) -> Run:
    """Run `files` in `scratch` in one pytest process, recording which files fail; the
    catcher plugin is imported from `plugins` (a folder of its own, not the scratch tree)."""
    report = scratch / ".fault_report.json"
    report.unlink(missing_ok=True)
    env = {**os.environ, "HOOKEDATTN_FAULT_REPORT": str(report)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plugins), env.get("PYTHONPATH")]))
    command = [
        sys.executable,
        "-m",
        "pytest",
        *files,
        "-q",
        "-p",
        "no:cacheprovider",
        "-p",
        "_fault_catcher",
        "--no-header",
        "-rN",
    ]
    start = time.perf_counter()
    try:
        done = subprocess.run(
            command, cwd=scratch, env=env, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        return Run({}, time.perf_counter() - start, f"timed out after {timeout:.0f} s")
    seconds = time.perf_counter() - start
    if not report.is_file():  # pytest did not reach the end of its session
        return Run({}, seconds, (done.stdout + done.stderr)[-2000:])
    return Run(json.loads(report.read_text())["failed"], seconds)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What the check found for one fault."""

    fault: Fault
    problem: str | None  # why it does not apply, or None
    caught_by: tuple[str, ...] = ()
    first_failures: tuple[str, ...] = ()
    seconds: float = 0.0
    unfinished: str | None = None


def inject(
    fault: Fault, scratch: Path, plugins: Path, excluded: set[str], timeout: float
) -> Outcome:
    """Apply `fault` in `scratch`, run its test files, put the file back."""
    problem = fault.problem(scratch)
    if problem is not None:
        return Outcome(fault, problem)
    path = scratch / fault.file
    clean = path.read_text()
    path.write_text(clean.replace(fault.original, fault.replacement))
    try:
        run = run_tests(scratch, plugins, [t for t in fault.tests if t not in excluded], timeout)
    finally:
        path.write_text(clean)
    caught = tuple(t for t in fault.tests if t in run.failed)
    firsts = tuple(run.failed[t] for t in caught)
    return Outcome(fault, None, caught, firsts, run.seconds, run.unfinished)


# ------------------------------------------------------------------------ the report
def describe(outcome: Outcome, min_files: int) -> str:
    """One fault's lines of the report."""
    fault = outcome.fault
    if outcome.problem is not None:
        return f"NO LONGER APPLIES  {fault.id}: {outcome.problem}"
    mark = "ok  " if len(outcome.caught_by) >= min_files else "MISS"
    names = ", ".join(Path(t).stem for t in outcome.caught_by) or "nothing"
    late = "" if outcome.unfinished is None else f" (did not finish: {outcome.unfinished})"
    return (
        f"{mark} {fault.id}  [{len(outcome.caught_by)}/{len(fault.tests)}, "
        f"{outcome.seconds:.0f} s{late}]\n       caught by {names}"
    )


def summary(outcomes: list[Outcome], min_files: int, seconds: float, workers: int) -> str:
    """The last lines: how many faults were caught by enough files, and how long it took."""
    stale = [o for o in outcomes if o.problem is not None]
    applied = [o for o in outcomes if o.problem is None]
    enough = [o for o in applied if len(o.caught_by) >= min_files]
    missed = [o.fault.id for o in applied if len(o.caught_by) < min_files]
    lines = [
        f"{len(outcomes)} faults: {len(enough)} caught by at least {min_files} test files"
        f", {len(missed)} not, {len(stale)} no longer apply; "
        f"{seconds / 60:.1f} min with {workers} worker(s)"
    ]
    if missed:
        lines.append(f"caught by fewer than {min_files} files: {', '.join(missed)}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------ main
def check_only(faults: list[Fault], root: Path) -> int:
    """Print whether each fault applies to the tree at `root`; 1 if any does not."""
    problems = [(f, f.problem(root)) for f in faults]
    for fault, problem in problems:
        print(
            f"{'applies' if problem is None else 'NO LONGER APPLIES'}  {fault.id}"
            + ("" if problem is None else f": {problem}")
        )
    stale = sum(p is not None for _, p in problems)
    print(f"{len(faults)} faults, {len(faults) - stale} apply, {stale} no longer apply")
    return 1 if stale else 0


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_all(faults: list[Fault], root: Path, args: argparse.Namespace) -> list[Outcome]:
    """The baseline, then every fault, on `args.workers` scratch copies."""
    start, cpu, outcomes = time.perf_counter(), _children_cpu(), []
    with tempfile.TemporaryDirectory(prefix="hookedattn-faults-") as tmp:
        plugins = Path(tmp) / "plugins"
        plugins.mkdir()
        shutil.copy2(PLUGIN, plugins / PLUGIN.name)
        scratches = [scratch_copy(root, Path(tmp) / f"copy{i}") for i in range(args.workers)]
        files = sorted({t for f in faults for t in f.tests if (root / t).is_file()})
        baseline = run_tests(scratches[0], plugins, files, 4 * args.timeout)
        if baseline.unfinished is not None:
            raise SystemExit(f"the baseline run did not finish:\n{baseline.unfinished}")
        excluded = set(baseline.failed)
        print(
            f"baseline: {len(files)} test files in {baseline.seconds:.0f} s; "
            f"{len(excluded)} fail without a fault{': ' if excluded else ''}"
            f"{', '.join(sorted(excluded))}",
            flush=True,
        )
        with concurrent.futures.ThreadPoolExecutor(args.workers) as pool:
            free = list(scratches)

            def one(fault: Fault) -> Outcome:
                scratch = free.pop()
                try:
                    return inject(fault, scratch, plugins, excluded, args.timeout)
                finally:
                    free.append(scratch)

            for outcome in pool.map(one, faults):
                print(describe(outcome, args.min_files), flush=True)
                outcomes.append(outcome)
    elapsed, cpu = time.perf_counter() - start, _children_cpu() - cpu
    print(summary(outcomes, args.min_files, elapsed, args.workers))
    print(f"CPU time of the test processes: {cpu / 60:.1f} min (baseline included)")
    if args.json:
        write_json(Path(args.json), outcomes, baseline, (elapsed, cpu), args.workers)
    return outcomes


def write_json(
    path: Path, outcomes: list[Outcome], baseline: Run, seconds: tuple[float, float], workers: int
) -> None:
    """The outcomes, the baseline and the time (wall and CPU seconds), as JSON."""
    rows = [
        {
            "id": o.fault.id,
            "what": o.fault.what,
            "file": o.fault.file,
            "problem": o.problem,
            "tests": list(o.fault.tests),
            "caught_by": list(o.caught_by),
            "first_failures": list(o.first_failures),
            "seconds": round(o.seconds, 1),
            "unfinished": o.unfinished,
        }
        for o in outcomes
    ]
    data = {
        "faults": rows,
        "baseline_failures": baseline.failed,
        "baseline_seconds": round(baseline.seconds, 1),
        "seconds": round(seconds[0], 1),
        "cpu_seconds": round(seconds[1], 1),
        "workers": workers,
        "python": sys.version.split()[0],
    }
    path.write_text(json.dumps(data, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--faults", default=str(FAULTS), help="the TOML list of faults")
    parser.add_argument("--root", default=str(ROOT), help="the tree to copy (a git checkout)")
    parser.add_argument("--only", nargs="+", metavar="ID", help="run only these faults")
    parser.add_argument("--workers", type=int, default=1, choices=(1, 2))
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run")
    parser.add_argument("--min-files", type=int, default=2, help="test files that must catch")
    parser.add_argument("--check", action="store_true", help="only check the faults apply")
    parser.add_argument("--json", help="also write the outcomes to this JSON file")
    args = parser.parse_args(argv)
    root, faults = Path(args.root).resolve(), load_faults(Path(args.faults))
    if args.only:
        unknown = sorted(set(args.only) - {f.id for f in faults})
        if unknown:
            parser.error(f"unknown fault ids {unknown}; see {args.faults}")
        faults = [f for f in faults if f.id in args.only]
    if args.check:
        return check_only(faults, root)
    outcomes = run_all(faults, root, args)
    bad = [o for o in outcomes if o.problem is not None or len(o.caught_by) < args.min_files]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
