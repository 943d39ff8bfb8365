"""Every Python example in the README and the documentation site runs as written.

Each page's examples run in one fresh interpreter, in order, each in a namespace of its own
(as a reader runs them one by one), in an empty folder.
"""

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def examples(page: Path) -> list[str]:
    """The page's ```python blocks; a user's test file (it needs pytest's fixtures) is run by
    tests/project/test_pytest_plugin.py instead."""
    blocks = re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.S)
    return [block for block in blocks if "def test_" not in block]


# The generation guide's examples are run by tests/generation/test_generation_docs.py, which
# also holds each one's printed output to the page's text block.
CHECKED_ELSEWHERE = {ROOT / "docs" / "guide" / "generation.md"}
PAGES_WITH_EXAMPLES = [page for page in PAGES if examples(page) and page not in CHECKED_ELSEWHERE]

# Runs each block in its own namespace and names the one that fails.
RUNNER = """
import json, sys, traceback
blocks = json.loads(open(sys.argv[1]).read())
for i, block in enumerate(blocks):
    try:
        exec(compile(block, f"<example {i}>", "exec"), {"__name__": "__main__"})
    except BaseException:
        print(f"example {i} failed:\\n{block}", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
"""


def test_the_docs_have_examples():
    assert sum(len(examples(page)) for page in PAGES) >= 12


def _with_this_checkout() -> dict[str, str]:
    # The examples import this checkout's packages, not whichever one pip installed.
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


# The pages whose examples load models by hub name run against a hub on 127.0.0.1 serving
# tiny random models under those names (tests/helpers/hub.py), as a networked user's would.
HUB_PAGES = {
    ROOT / "README.md",
    *(ROOT / "docs" / "guide" / p for p in ("loading.md", "porting.md")),
}


def serve_named_models(monkeypatch: pytest.MonkeyPatch, home: Path) -> Any:
    """A started hub the environment points at, serving `gpt2` and `EleutherAI/pythia-70m`
    (its `main` and `step1000`); a context manager that stops it."""
    from helpers.hub import HubServer, serve_hf_model, tiny_causal_lm, use_hub, word_tokenizer

    server = HubServer().start()
    use_hub(monkeypatch, server.url, home)
    serve_hf_model(server, "gpt2", tiny_causal_lm("gpt2"), word_tokenizer())
    for seed, revision in enumerate(("main", "step1000")):
        model = tiny_causal_lm("gpt_neox", seed)
        serve_hf_model(server, "EleutherAI/pythia-70m", model, word_tokenizer(), revision)
    return server


@pytest.mark.parametrize("page", PAGES_WITH_EXAMPLES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_example_on_the_page_runs(page, tmp_path, monkeypatch):
    with contextlib.ExitStack() as stack:
        if page in HUB_PAGES:
            stack.enter_context(serve_named_models(monkeypatch, tmp_path / "hf-home"))
        blocks = tmp_path / "blocks.json"
        blocks.write_text(json.dumps(examples(page)))
        runner = tmp_path / "run_examples.py"
        runner.write_text(RUNNER)
        proc = subprocess.run(
            [sys.executable, str(runner), str(blocks)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
            env=_with_this_checkout(),
        )
    assert proc.returncode == 0, proc.stderr[-4000:]


def test_the_training_table_gives_each_shipped_models_recorded_cpu_time():
    from hookedattn import list_pretrained

    text = (ROOT / "docs" / "guide" / "shipped-models.md").read_text()
    for info in list_pretrained():
        row = re.search(rf"\| `{info.name}` .*\| ([\d.]+) (s|min) \|", text)
        assert row, f"no row for {info.name} in the shipped-models guide's training table"
        seconds = float(row[1]) * (60 if row[2] == "min" else 1)
        recorded = info.training["cpu_seconds"]
        shown = round(recorded / 60, 1) * 60 if row[2] == "min" else round(recorded)
        assert seconds == pytest.approx(shown), (info.name, seconds, recorded)
