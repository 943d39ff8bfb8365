"""pytest plugin for `scripts/faults.py`: which test files fail, and no more work than that.

Loaded with `-p _fault_catcher` (the scripts folder on PYTHONPATH). Once a test of a file
fails (or the file fails to collect), the file has caught the fault: its remaining tests
are skipped. At the end it writes `{"failed": {file: first failing test}, "ran": {file:
tests run}}` as JSON to the path in `HOOKEDATTN_FAULT_REPORT`.
"""

import json
import os
from pathlib import Path

import pytest


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


class FaultCatcher:
    """Records the first failure of each test file and skips the rest of that file."""

    def __init__(self, out: Path) -> None:
        self.out = out
        self.failed: dict[str, str] = {}
        self.ran: dict[str, int] = {}

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        """Skip a test whose file has already failed: one failure is enough to catch."""
        if _file_of(item.nodeid) in self.failed:
            pytest.skip("this file has caught the fault already")

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Count the tests run per file; note each file's first failure."""
        file = _file_of(report.nodeid)
        if report.when == "call":
            self.ran[file] = self.ran.get(file, 0) + 1
        if report.failed and file not in self.failed:
            self.failed[file] = f"{report.nodeid} ({report.when})"

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        """A file that fails to collect (an import error) has caught the fault too."""
        if report.failed:
            self.failed.setdefault(_file_of(report.nodeid), f"{report.nodeid} (collection)")

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Write what was found."""
        self.out.write_text(json.dumps({"failed": self.failed, "ran": self.ran}, indent=1))


def pytest_configure(config: pytest.Config) -> None:
    """Register the catcher when the report path is set (else do nothing)."""
    out = os.environ.get("HOOKEDATTN_FAULT_REPORT")
    if out:
        config.pluginmanager.register(FaultCatcher(Path(out)), "hookedattn-fault-catcher")
