"""Run a TransformerLens demo script as written and keep what it computed and printed.

`run_demo(source, namespace, filename)` executes the script's text with the given globals
(its weights, config, tokenizer folder) and returns `{"results": ..., "printed": ...}`: the
script's `results` dict and everything it printed. The tests run the same text twice, under
real TransformerLens and after `hookedattn_tl.install()`, and compare both parts.

Run as a program with real TransformerLens (in its own environment):

    python scripts/tl_demo.py IN.pt OUT.pt

reads `{"source", "namespace", "filename"}` from IN.pt and writes `run_demo`'s answer, and
the version of the library it ran on (`package` in IN.pt, TransformerLens by default), to
OUT.pt. tests/tl/test_tl_exploratory_demo.py, tests/tl/test_tl_patching_demo.py and
tests/tl/test_saelens_tutorial.py (SAELens's) run it so.
"""

import contextlib
import importlib.metadata
import io
import sys
from typing import Any

import torch


def run_demo(source: str, namespace: dict[str, Any], filename: str) -> dict[str, Any]:
    """The demo's `results` and its printed output, after running `source` in `namespace`.

    A demo may set global torch state, as notebooks do (`torch.set_grad_enabled(False)`);
    the grad mode is restored afterwards, so the demo leaves the process as it found it."""
    printed = io.StringIO()
    scope = dict(namespace)
    with contextlib.redirect_stdout(printed), torch.set_grad_enabled(torch.is_grad_enabled()):
        exec(compile(source, filename, "exec"), scope)
    return {"results": scope["results"], "printed": printed.getvalue()}


def main() -> None:
    """`python scripts/tl_demo.py IN.pt OUT.pt`, with real TransformerLens importable."""
    torch.set_num_threads(1)
    source, target = sys.argv[1], sys.argv[2]
    given = torch.load(source, weights_only=False)
    answer = run_demo(given["source"], given["namespace"], given["filename"])
    answer["version"] = importlib.metadata.version(given.get("package", "transformer_lens"))
    torch.save(answer, target)


if __name__ == "__main__":
    main()
