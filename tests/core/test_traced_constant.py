"""`constant_when_traced` marks a function as torch's own marker does, without importing
torch's compiler, and `import hookedattn` imports neither the compiler nor DTensors."""

import subprocess
import sys

import torch

from hookedattn.core._traced_constant import MARK, constant_when_traced


def test_torchs_marker_sets_exactly_the_mark_ours_sets():
    def theirs() -> int:
        return 1

    def ours() -> int:
        return 1

    torch.compiler.assume_constant_result(theirs)
    constant_when_traced(ours)
    assert theirs.__dict__ == ours.__dict__ == {MARK: True}


def test_importing_hookedattn_leaves_torchs_compiler_and_dtensors_unimported():
    heavy = ("torch._dynamo", "torch.distributed.tensor")
    code = f"import sys, hookedattn; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
