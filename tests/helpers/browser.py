"""Pages in a real browser: Debian's headless Chromium, driven by Playwright. `browser` is a
module-scoped fixture (import it into the test module); `Opened` watches a page for console
errors and for requests (all intercepted; none may leave the file) and keeps screenshots in
reports/tests/viewer/ (ignored by git) as the tests' artefacts."""

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

try:
    from playwright.sync_api import sync_playwright
except ImportError:  # the `browser` extra is not installed
    sync_playwright = None

CHROMIUM = Path("/usr/bin/chromium")
ARTEFACTS = Path(__file__).resolve().parents[2] / "reports" / "tests" / "viewer"
# No GPU, no sandbox (containers), and nothing the browser would fetch on its own.
ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip


# A browser test module's `pytestmark`: it skips where the browser cannot run.
NEEDS_A_BROWSER = pytest.mark.skipif(
    sync_playwright is None or not CHROMIUM.exists(),
    reason="needs Playwright (pip install -e '.[browser]') and Chromium at /usr/bin/chromium "
    "(apt-get install chromium); .ci/run installs both",
)


@contextlib.contextmanager
def launched(width: int = 1200) -> Iterator:
    """Chromium on a fresh profile of its own, its pages `width` pixels wide and 900 high."""
    profile = tempfile.mkdtemp(prefix="chromium-profile-")
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            profile,
            executable_path=str(CHROMIUM),
            headless=True,
            args=ARGS,
            viewport={"width": width, "height": 900},
        )
        yield context
        context.close()
    shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    """Chromium, for one test module (pages 1200 pixels wide)."""
    with launched() as context:
        yield context


class Opened:
    """A page opened in the browser, with what it logged and what it tried to fetch."""

    def __init__(self, browser, path: Path, ready: bool = True) -> None:
        self.url = path.resolve().as_uri()
        self.errors: list[str] = []
        self.requests: list[str] = []
        self.page = browser.new_page()
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else 0)
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.route("**/*", self._intercept)
        self.page.goto(self.url)
        if ready:  # the viewer's script has drawn the page
            self.page.wait_for_selector("body[data-ready=true]", timeout=10_000)

    def _intercept(self, route) -> None:
        if route.request.url == self.url:
            route.continue_()
            return
        self.requests.append(route.request.url)
        route.abort()

    def cells(self, svg_id: str) -> list[tuple[int, int, float]]:
        return self.page.eval_on_selector_all(
            f"#{svg_id} rect.cell",
            "cells => cells.map(c => [+c.dataset.row, +c.dataset.col, c.dataset.value])",
        )

    def close(self, screenshot: str | None = None) -> None:
        """Keep a screenshot, then check that the page logged no error and fetched nothing."""
        if screenshot:
            ARTEFACTS.mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=ARTEFACTS / screenshot, full_page=True)
        self.page.close()
        assert self.errors == [], self.errors
        assert self.requests == [], self.requests


def saved(page, tmp_path: Path, name: str) -> Path:
    return page.save(tmp_path / name)
