"""TransformerLens 4's Main Demo (scripts/tl4_main_demo.py) agrees with real TL 4.3.

The demo's text runs twice on the same tiny local GPT-2 (random weights, saved with
transformers): under real TransformerLens 4.3 in its own environment, with the alias line
removed (scripts/tl_demo.py, a subprocess), and here after the alias line. Every printed
line must read the same, every printed number within one unit of its last digit (or the
comparisons' float32 tolerance), and the tensors it keeps must agree.
"""

import pytest
from helpers.tl_reference import (
    ROOT,
    assert_same,
    assert_same_printout,
    require_tl4_python,
    run_script,
    save_tiny_gpt2,
    script_module,
)

import hookedattn_tl

pytestmark = pytest.mark.slow

DEMO = ROOT / "scripts" / "tl4_main_demo.py"
ALIAS_LINE = "import hookedattn_tl.as_transformer_lens  # noqa: F401  (the alias line)\n"


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> tuple[dict, dict]:
    folder = save_tiny_gpt2(tmp_path_factory.mktemp("tiny_gpt2"))
    source = DEMO.read_text()
    assert ALIAS_LINE in source
    given = {
        "source": source.replace(ALIAS_LINE, ""),
        "namespace": {"model_path": str(folder)},
        "filename": str(DEMO),
    }
    theirs = run_script(
        require_tl4_python(), "tl_demo.py", given, tmp_path_factory.mktemp("tl4"), None
    )
    hookedattn_tl.install()
    try:
        ours = script_module("tl_demo").run_demo(source, given["namespace"], str(DEMO))
    finally:
        hookedattn_tl.uninstall()
    return ours, theirs


def test_the_demo_ran_on_each_library(runs):
    ours, theirs = runs
    assert theirs["version"] == "4.3.0"
    assert "Model loss:" in ours["printed"]


def test_every_printed_number_agrees_with_transformer_lens_4(runs):
    ours, theirs = runs
    numbers = assert_same_printout(ours["printed"], theirs["printed"])
    assert numbers >= 400


def test_the_kept_tensors_agree(runs):
    ours, theirs = runs
    assert_same(ours["results"], theirs["results"], "results")
